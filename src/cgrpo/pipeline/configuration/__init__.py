"""The experiment's configuration: the checks a workflow config gets before Snakemake plans a job (`checks`,
`options`), the typed spec of every job built from it (`specs`), the method registry (`methods`, with the prompt
allocators' methods from `allocator_methods`, imported here so that the registry holds them), the modules a
config's `plugins` name (`plugins`), and what a results folder was made with (`provenance`).

It imports the tasks and the trainer library, never a job or an analysis module.
"""

from . import allocator_methods  # noqa: F401

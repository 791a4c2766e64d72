"""The trainer library stands apart from the experiment pipeline built on it."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_trainer_loads_no_pipeline_module_snakemake_or_matplotlib():
    code = (
        "import sys\n"
        "from cgrpo import CGRPOConfig, CGRPOTrainer\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('snakemake', 'matplotlib') or m.startswith('cgrpo.pipeline')]\n"
        "print(sorted(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"

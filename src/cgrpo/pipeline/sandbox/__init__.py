"""Running model-written programs contained (docs/sandbox.md): `runner` starts one contained process per program,
`harness` is the source that process runs (standard library only, never imported), `host` the per-run cgroup and
hidden paths on the host, `seccomp` the system-call filter, and `judging` the tests' split and verdict on the
caller's side.
"""

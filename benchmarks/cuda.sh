#!/usr/bin/env bash
# Every CUDA measurement of benchmarks/, one JSON file each into OUT (default: benchmarks/), so a run
# cut short keeps what it finished. Needs one NVIDIA GPU and fedsweep's dependencies but neither
# Ray nor MLflow (nothing here starts a sweep): torch, lightning, pydantic, numpy, scikit-learn,
# pyyaml, matplotlib. Run from the repository's root:
#
#     bash benchmarks/cuda.sh [OUT]
#
# 1. sweeps/fedlga.yaml's own 72 trials on CUDA, one after another and packed 8, 36 and 72 a pack
#    (benchmarks/pack.py --sweep): the training side of "≥ 4× the unpacked trials per minute";
# 2. packed against one by one for the MLP, CNN and ResNet-18 at packs 1-64, with the MLP's bare
#    arithmetic, in full float32 (matmul_precision highest, the runs' default) and in TF32 (high);
# 3. `fedsweep bench` of the MLP, CNN and ResNet-18 (on CIFAR-shaped data): the vectorized engine
#    against the loop engine, the rule `engine: auto` follows.
set -euo pipefail
out="${1:-benchmarks}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.__version__)"
for p in 8 36 72; do
  "$py" benchmarks/pack.py --device cuda --sweep sweeps/fedlga.yaml --pack "$p" --repeat 2 \
    --json "$out/results-pack-sweep-cuda-p$p.json"
done
"$py" benchmarks/pack.py --device cuda --models mlp cnn resnet18 --packs 1 8 16 32 64 --arithmetic \
  --json "$out/results-pack-cuda.json"
"$py" benchmarks/pack.py --device cuda --models mlp cnn resnet18 --packs 1 8 16 32 64 --arithmetic \
  --matmul-precision high --json "$out/results-pack-cuda-tf32.json"
"$py" -m fedsweep.cli bench --device cuda --models mlp cnn resnet18 --json "$out/results-engines-cuda.json"

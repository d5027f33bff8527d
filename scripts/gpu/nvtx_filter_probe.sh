#!/usr/bin/env bash
# Which ncu --nvtx-include expressions select kernels inside nested ple_bench ranges?
cat > /tmp/nvtx_probe.py <<'PY'
import torch
from ple_bench.annotate import annotate
x = torch.ones(1 << 20, device="cuda")
with annotate("case demo"):
    with annotate("lookup"):
        x.add_(1)                       # kernel 1: outside measurement
        with annotate("measurement"):
            x.mul_(2)                   # kernel 2: inside measurement
torch.cuda.synchronize()
PY
for f in 'ple_bench@measurement/' 'ple_bench@*/measurement/' 'ple_bench@case demo/lookup/measurement/' 'ple_bench@case demo/*/measurement/'; do
  n=$(ncu --clock-control none --nvtx --nvtx-include "$f" python3 /tmp/nvtx_probe.py 2>&1 | grep -c "==PROF== Profiling")
  echo "filter '$f': kernels profiled=$n"
done

# Source on the GPU machine: carried wheels (nvtx, ninja: the image lacks them), PYTHONPATH, unbuffered output.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the CPU gather's native direct path (backends/cuda/native): built once per fresh machine, before any
# case, so its build time (tens of seconds) is logged here and not paid inside a case's setup
python3 -c "import torch, time; t = time.time()
from ple_bench.backends.cuda.native import host_gather_module, native_status
host_gather_module(); print(f'native host gather: {native_status()} ({time.time() - t:.0f} s)')"

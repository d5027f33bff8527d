import sys, torch, faulthandler
faulthandler.enable()
from ple_bench.backends import get_backend
case = sys.argv[1]
b = get_backend("pinned_cpu_gather")(1 << 16, 160, dtype="fp8", num_heads=16, max_tokens=64, device="cuda")
b.fill_synthetic(1, scale=0.5)
ids = torch.randint(0, 1 << 16, (64, 16))
b.lookup(ids)
nat = b._direct().native
bad = torch.full((64, 16), 1 << 16, dtype=torch.int64)
from ple_bench.backends.cudart import current_stream_handle
h = current_stream_handle(0)
try:
    if case == "rows":
        nat.rows(bad, torch.empty(64, 2560, dtype=torch.uint8, device="cuda"), h)
    elif case == "lookup":
        nat.lookup(bad, h)
    elif case == "isel":
        nat.configure(0); nat.rows(bad, torch.empty(64, 2560, dtype=torch.uint8, device="cuda"), h)
    elif case == "neg":
        bad.fill_(-1); nat.rows(bad, torch.empty(64, 2560, dtype=torch.uint8, device="cuda"), h)
    elif case == "cpu":
        from ple_bench.backends.native import host_gather_module
        t = torch.zeros(1 << 16, 160, dtype=torch.uint8)
        g = host_gather_module().HostGather(t, torch.uint8, "cpu", 2560, 16, 0, 0, 0, 0)
        g.rows(bad, torch.empty(64, 2560, dtype=torch.uint8), 0)
    elif case == "valerr":
        nat.rows(ids, torch.empty(64, 2561, dtype=torch.uint8, device="cuda"), h)
except Exception as e:
    print(case, "raised", type(e).__name__, str(e).splitlines()[0])
else:
    print(case, "no error")

"""The native host gather's errors on a GPU machine: each bad call returns its failure value
and names its error, and the backend raises it -- nothing crashes.

Its first version (git history) crashed on every case but one: on the lent H200 image any
exception thrown from the module's own code segfaulted the process, while the same error
thrown inside libtorch reached Python (docs/gpu-logs/session6/05-native-errors-segfault.log).
The module now returns errors instead (host_gather.cpp).
Run: ``python3 scripts/gpu/native_errors.py`` (exit 0: every case as expected).
"""

from __future__ import annotations

import sys

import torch

from ple_bench.backends import get_backend
from ple_bench.backends.cudart import current_stream_handle
from ple_bench.backends.native import native_error, new_host_gather


def main() -> int:
    vocab, heads = 1 << 16, 16
    b = get_backend("pinned_cpu_gather")(vocab, 160, dtype="fp8", num_heads=heads, max_tokens=64, device="cuda")
    b.fill_synthetic(1, scale=0.5)
    ids = torch.randint(0, vocab, (64, heads))
    b.lookup(ids)
    b.lookup(ids)  # the second call takes the one-closure path
    nat = b._direct().native
    h = current_stream_handle(0)
    bad = torch.full((64, heads), vocab, dtype=torch.int64)
    host = new_host_gather(torch.zeros(vocab, 160, dtype=torch.uint8), torch.uint8, "cpu", heads * 160, 16, 0, 0, 0, 0)
    dev_out = torch.empty(64, heads * 160, dtype=torch.uint8, device="cuda")
    cases = {
        "valerr": (lambda: nat.rows(ids, torch.empty(64, 2561, dtype=torch.uint8, device="cuda"), h), ValueError),
        "cpu": (lambda: host.rows(bad, torch.empty(64, heads * 160, dtype=torch.uint8), 0), IndexError),
        "rows": (lambda: nat.rows(bad, dev_out, h), IndexError),
        "lookup": (lambda: nat.lookup(bad, h), IndexError),
        "neg": (lambda: nat.rows(torch.full_like(bad, -1), dev_out, h), IndexError),
    }
    failed = 0
    for name, (call, want) in cases.items():
        got = call()
        failed_value = got is None or (isinstance(got, float) and got < 0)
        err = native_error(nat if name != "cpu" else host) if failed_value else None
        ok = failed_value and isinstance(err, want)
        failed += not ok
        print(f"{name:>8}: returned {got!r:.40}, {type(err).__name__ if err else '-'}: {err}  {'ok' if ok else 'FAIL'}")
    nat.configure(0)  # index_select inside the call: libtorch's error, caught and returned
    got = nat.rows(bad, dev_out, h)
    ok = got < 0 and isinstance(native_error(nat), IndexError)
    failed += not ok
    print(f"{'isel':>8}: returned {got}, {native_error(nat)!r:.80}  {'ok' if ok else 'FAIL'}")
    nat.configure(64)
    for name, x in (("backend", bad), ("backend-", torch.full_like(bad, -1))):
        try:
            b.lookup(x)
            print(f"{name:>8}: no error  FAIL")
            failed += 1
        except IndexError as e:
            print(f"{name:>8}: IndexError: {e}  ok")
    got = b.lookup(ids)  # the backend still works after the failures
    torch.cuda.synchronize()
    ok = torch.equal(got.view(torch.uint8).cpu(), torch.index_select(b.weight.view(torch.uint8).view(vocab, -1), 0,
                                                                     ids.view(-1)).view(64, -1))
    failed += not ok
    print(f"   after: a good lookup {'equals' if ok else 'DIFFERS FROM'} index_select  {'ok' if ok else 'FAIL'}")
    b.close()
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

# Every KernelBench problem (../shared/kernelbench) run on the meta device (no memory, CPU): its inputs and outputs in bytes;
# which are large by the judge's rule (5 x inputs > a quarter of an H100), and what the twenty-second session's account
# (3 x inputs + 2 x outputs + the float64 allowance + 1.5 GiB) says of two large correctness phases at once.
# .venv/bin/python docs/data/h100-judge/session22/large_scan.py  (from the repository root)
import json, torch, types, sys, math
H100 = 79.6 * 2**30
rows = []
for line in open('../shared/kernelbench/kernelbench_levels1-3.jsonl'):
    d = json.loads(line)
    mod = types.ModuleType('m'); 
    try:
        exec(d['code'], mod.__dict__)
        with torch.device('meta'):
            torch.manual_seed(0)
            inputs = mod.get_inputs(); init = mod.get_init_inputs()
            model = mod.Model(*init)
            out = model(*inputs)
    except Exception as e:
        rows.append((d['level'], d['name'], None, None, repr(e)[:80])); continue
    def nbytes(x):
        if isinstance(x, torch.Tensor): return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)): return sum(nbytes(v) for v in x)
        return 0
    rows.append((d['level'], d['name'], nbytes(inputs), nbytes(out), ''))
fails = [r for r in rows if r[2] is None]
print('meta failures', len(fails)); [print(' ', r) for r in fails[:10]]
G = 2**30
ok = [r for r in rows if r[2] is not None]
large_now = [r for r in ok if 5 * r[2] > 0.25 * H100]
print('large by inputs', len(large_now))
big_out = sorted([r for r in ok if 5 * r[2] <= 0.25 * H100 and (3*r[2] + 2*r[3]) > 0.25 * H100], key=lambda r: -r[3])
print('ordinary by inputs, but 3I+2O > a quarter of an H100:', len(big_out))
for r in big_out[:20]: print('  L%d %-45s in %.2f GiB out %.2f GiB' % (r[0], r[1][:45], r[2]/G, r[3]/G))
print()
G=2**30
for allowance in (4.98, 1.24):
    est = sorted(((3*r[2] + 2*r[3])/G + allowance + 1.5, r) for r in large_now)
    half = (79.2 - 6) / 2
    print('allowance %.2f: phases %.1f-%.1f GiB; <= %.1f (two fit an H100 with 6 GiB for contexts): %d of %d; <= %.1f (an H200): %d'
          % (allowance, est[0][0], est[-1][0], half, sum(e <= half for e, _ in est), len(est), (139.8-6)/2, sum(e <= (139.8-6)/2 for e, _ in est)))
by_level = {}
for r in large_now: by_level[r[0]] = by_level.get(r[0], 0) + 1
print('large by level', by_level)

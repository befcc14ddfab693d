"""Training stall of a checkpoint: synchronous vs asynchronous saves through `torch.distributed.checkpoint`, and what the
checkpoints' checksums cost.

    torchrun --standalone --nproc_per_node 2 bench/bench_async_save.py OUT [--width 2048] [--every 5]   # or python ... for 1 process

The same fit in five ways, alternating, `--fits` times each: without checkpoints, with `CheckpointCallback(every_steps=...)`
and with `async_save=True`, each with the checksums (CRC32C) and without them (a no-op checksum). The stall is the time the
training loop spends in the callback (for async: copying the tensors, putting written checkpoints in place, waiting for the
previous write and, at the end of the fit, for the last one); each mode's median fit is shown. Then, side by side on one
learner, round by round: `save_state` with each checksum and without, the return of an asynchronous `save_state`,
`load_state` verified and not; and each checksum's speed. A ratio is the median of each round's ratio (other work on the
machine changes from round to round). The main process prints one JSON line per fit, a table of the
side-by-side timings, and the targets."""
import argparse, json, os, random, time, zlib, torch
from functools import partial
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint.checksums import checksum_algos
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('out', help='folder for the checkpoints')
p.add_argument('--width', type=int, default=2048, help='hidden width of the MLP (2048: 4.7M parameters, checkpoints of 57 MB with Adam)')
p.add_argument('--every', type=int, default=5, help='checkpoint every this many optimizer steps')
p.add_argument('--epochs', type=int, default=2)
p.add_argument('--fits', type=int, default=5, help="alternating repeats of each fit (the median stall's fit is shown)")
p.add_argument('--repeats', type=int, default=25, help='alternating repeats of each side-by-side timing (the median is shown)')
args = p.parse_args()
main = int(os.environ.get('RANK', 0)) == 0
checksum_algos['off'] = lambda data, value=0: value # "without checksums": the same code path, no checksum computed

stalls = []
def timed(f):
    def _inner(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: stalls[-1] += time.perf_counter() - t
    return _inner
CheckpointCallback.after_batch,CheckpointCallback.after_fit = timed(CheckpointCallback.after_batch),timed(CheckpointCallback.after_fit)

parts = {} # the stall's parts: `save_state` (sync: the whole write; async: copying, then starting the background write), `finish_save` waits
def part(name, f):
    def _inner(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: parts[name] = parts.get(name, 0.) + time.perf_counter() - t
    return _inner
Learner.save_state,Learner.finish_save = part('save_state', Learner.save_state),part('finish_save', Learner.finish_save)

class BatchTime(Callback):
    order = 99
    def before_fit(self): self.times = []
    def before_batch(self): self.t = time.perf_counter()
    def after_batch(self):
        if self.training: self.times.append(time.perf_counter() - self.t)

def learner():
    set_seed(0)
    x,y = torch.randn(2048, 256),torch.randint(0, 10, (2048,))
    dsets = Datasets(range(2048), [[x.__getitem__], [y.__getitem__]], splits=[list(range(1792)), list(range(1792, 2048))])
    dls = dsets.dataloaders(bs=64, device='cpu', num_workers=0)
    w = args.width
    learn = Learner(dls, nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)), loss_func=nn.CrossEntropyLoss())
    return learn.accelerate()

def fit(mode, checksum='crc32c'):
    defaults.checkpoint_checksum = checksum
    learn,bt = learner(),BatchTime()
    name = mode + ('' if checksum == 'crc32c' or mode == 'none' else f'-{checksum}')
    cbs = [bt] if mode == 'none' else [bt, CheckpointCallback(Path(args.out)/name, every_steps=args.every, every_epochs=None, keep=1,
                                                               async_save=mode == 'async')]
    stalls.append(0.); parts.clear()
    t0 = time.perf_counter()
    with learn.no_bar(), learn.no_logging(): learn.fit(args.epochs, 1e-3, cbs=cbs)
    total = time.perf_counter() - t0
    n_ckpt = 0 if mode == 'none' else learn.train_iter//args.every
    n_params = sum(p.numel() for p in learn.model.parameters())
    return learn,dict(mode=name, procs=learn.accelerator.num_processes, params_M=round(n_params/1e6, 2),
                      ckpt_MB=round(3*4*n_params/1e6, 1), checkpoints=n_ckpt, stall_ms_per_ckpt=round(1e3*stalls[-1]/max(n_ckpt, 1), 1),
                      **{f'{k}_ms_per_ckpt': round(1e3*v/max(n_ckpt, 1), 1) for k,v in parts.items()},
                      median_batch_ms=round(1e3*sorted(bt.times)[len(bt.times)//2], 1), fit_s=round(total, 2))

fit('none') # warm-up, not reported
runs,order = {},random.Random(0)
modes = (('none', 'off'), ('sync', 'crc32c'), ('sync', 'off'), ('async', 'crc32c'), ('async', 'off'))
for _ in range(args.fits): # every mode once a round, in a new order each round
    for mode,checksum in order.sample(modes, len(modes)):
        learn,r = fit(mode, checksum)
        runs.setdefault(r['mode'], []).append(r)
def median(xs): return sorted(xs)[len(xs)//2]
res = {k: sorted(v, key=lambda r: r['stall_ms_per_ckpt'])[len(v)//2] for k,v in runs.items()} # the median stall's fit
def fit_ratio(mode): # the median over rounds of each round's ratio: other work on the machine changes between rounds
    return median([a['stall_ms_per_ckpt']/b['stall_ms_per_ckpt'] for a,b in zip(runs[mode], runs[f'{mode}-off'])])

def timed(f):
    learn.barrier()
    t = time.perf_counter()
    f()
    return time.perf_counter() - t

# side by side on the last learner: each round times every variant of a kind back to back, in a new order each round
out,sides = Path(args.out)/'side-by-side',{}
def save(checksum, async_save=False):
    defaults.checkpoint_checksum = checksum
    secs = timed(lambda: learn.save_state(out/f'{async_save}-{checksum}', async_save=async_save))
    learn.finish_save()
    return secs
kinds = {'sync save': {c: partial(save, c) for c in ('off', 'crc32c', 'crc32')},
         'async save returns': {c: partial(save, c, True) for c in ('off', 'crc32c', 'crc32')},
         'load': {v: partial(lambda v: timed(lambda: learn.load_state(out/'False-crc32c', verify=v)), v) for v in ('off', 'crc32c')}}
save('crc32c') # the checkpoint the loads read
for _ in range(args.repeats):
    for kind in order.sample(list(kinds), len(kinds)):
        for k in order.sample(list(kinds[kind]), len(kinds[kind])): sides.setdefault((kind, k), []).append(kinds[kind][k]())
ms = {k: median(v)*1e3 for k,v in sides.items()}
def ratio(kind, k): return median([a/b for a,b in zip(sides[kind, k], sides[kind, 'off'])]) # paired, round by round

def speed(f, data):
    "GB/s of checksum `f` over `data`, the median of 5"
    ts = []
    for _ in range(5):
        t = time.perf_counter(); f(data); ts.append(time.perf_counter() - t)
    return len(data)/sorted(ts)[2]/1e9

if main:
    for r in res.values(): print(json.dumps(r))
    s,a,mb = res['sync'],res['async'],res['sync']['ckpt_MB']
    print(f"async stall / sync stall: {a['stall_ms_per_ckpt']/s['stall_ms_per_ckpt']:.2f} "
          f"({a['stall_ms_per_ckpt']} ms vs {s['stall_ms_per_ckpt']} ms per checkpoint of {mb} MB); "
          f"fit {res['none']['fit_s']} s without checkpoints, {s['fit_s']} s sync, {a['fit_s']} s async")
    print(f"\nSide by side ({learn.accelerator.num_processes} process(es), {mb} MB): medians in ms of {args.repeats} rounds "
          f"({args.fits} for the fits); a ratio is the median of each round's ratio\n")
    print('| timing | without checksums | CRC32C | ratio | CRC-32 (zlib) | ratio |\n|---|---|---|---|---|---|')
    for kind in ('sync save', 'async save returns'):
        print(f"| {kind} | {ms[kind, 'off']:.1f} | {ms[kind, 'crc32c']:.1f} | {ratio(kind, 'crc32c'):.3f}x | "
              f"{ms[kind, 'crc32']:.1f} | {ratio(kind, 'crc32'):.3f}x |")
    print(f"| load, verified (CRC32C) | {ms['load', 'off']:.1f} | {ms['load', 'crc32c']:.1f} | {ratio('load', 'crc32c'):.3f}x | | |")
    for mode in ('sync', 'async'):
        print(f"| fit's stall per {mode} checkpoint | {res[f'{mode}-off']['stall_ms_per_ckpt']} | {res[mode]['stall_ms_per_ckpt']} | "
              f"{fit_ratio(mode):.3f}x | | |")
    data = os.urandom(int(mb*1e6))
    candidates = {k: f for k,f in checksum_algos.items() if k != 'off'}
    for mod,name,f in (('crc32c', 'crc32c (LGPL)', 'crc32c'), ('isal.isal_zlib', 'isal CRC-32', 'crc32'), ('xxhash', 'xxh3_64', 'xxh3_64_intdigest')):
        try: candidates[name] = getattr(__import__(mod, fromlist=[f]), f)
        except ImportError: pass
    print('\nChecksum speeds over', mb, 'MB: ' + ', '.join(f'{k} {speed(f, data):.1f} GB/s' for k,f in candidates.items()))
    r = ratio('sync save', 'crc32c')
    print(f"\ntarget: sync save_state with CRC32C / without <= 1.05: {r:.3f}x -> {'PASS' if r <= 1.05 else 'FAIL'}")
    r = ratio('async save returns', 'crc32c')
    print(f"target: async save_state's return with CRC32C / without <= 1.05: {r:.3f}x -> {'PASS' if r <= 1.05 else 'FAIL'}")
    r = fit_ratio('async')
    print(f"target: fit's stall per async checkpoint with CRC32C / without <= 1.05: {r:.3f}x -> {'PASS' if r <= 1.05 else 'FAIL'}")

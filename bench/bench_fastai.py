"""Speed where fastai users feel it: tiny models, fastai loaders, many short fits, memory, two processes.

    .venv/bin/python bench/bench_fastai.py                      # every section, a few minutes on 2 CPU cores
    .venv/bin/python bench/bench_fastai.py --sections fits ddp  # some of them
    .venv/bin/python bench/bench_fastai.py --quick              # tiny sizes, one repeat: checks that it runs

Every section times its variants side by side in one run: each repeat runs every variant once, in turn, and the
tables give medians, min-max and ratios of medians. Sections:

- `models`: a tiny MLP (64-256-256-10, bs 64) and the mid-size one (784-512-512-10, bs 128), one epoch of
  training from one torch `DataLoader`: hand-written torch loop, hand-written Accelerate loop, stock fastai
  `Learner`, fastxtend_accel `Learner` with `.accelerate()`.
- `data`: the tiny MLP fed by a fastai `TfmdDL` (from `Datasets`) and by a torch `DataLoader` over the same
  tensors, each with and without `.accelerate()`, and the two loaders iterated alone.
- `fits`: 20 x `fit(1)` of 5 batches (the pattern of `fine_tune`, `lr_find`, notebooks): stock and accelerated
  `Learner`, and the same batches in one hand-written Accelerate loop and one torch loop.
- `memory`: peak RSS (and `max_memory_allocated` on a GPU) of three epochs of a wide MLP, one fresh process per
  variant, with glibc's mmap threshold fixed so that RSS follows the live tensors.
- `ddp`: 2 processes (torchrun, gloo on CPU): accelerated `Learner` vs a hand-written Accelerate DDP loop on
  the same shards (per-batch time, optimizer steps, gradient all-reduces, other collectives), the time per batch
  of `ShardedDL` over a `TfmdDL` vs that `TfmdDL` alone, and 20 short fits.

On a CPU with one thread, the 1-process sections time this process's CPU time (`--clock cpu`), which other jobs on
a shared machine disturb far less than the wall clock; the 2-process section times training with the wall clock, waits
included, and loaders iterated alone with each process's CPU time.

Each target of issue 12 is printed with PASS/FAIL at the end. They are read, never asserted: timings on a shared
machine are noisy, which is why every number is a ratio taken in the same run.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile, time, warnings
from pathlib import Path
import torch
from torch import nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from torch.optim.optimizer import register_optimizer_step_post_hook
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.data import ShardedDL, shard_dl
from accelerate import Accelerator
from bench_loop import use_clock, mlp, adamw, step_loop, TrainTimer, learner, learner_loop, iterate, timed, interleave, table, ratio, verdict, compare_loops

TINY,MID = (64, 256, 64),(784, 512, 128) # n_in, hidden, bs

def tensors(n, n_in, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n_in, generator=g),torch.randint(0, 10, (n,), generator=g)

def tfmd_dls(x, y, bs, n_train, device=None):
    "fastai `DataLoaders` over the same tensors, as a user builds them from `Datasets`: the first `n_train` items train"
    dsets = Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]], splits=[list(range(n_train)), list(range(n_train, len(x)))])
    return dsets.dataloaders(bs=bs, drop_last=True, device=device, num_workers=0) # in this process, as the torch `DataLoader`s

def section_models(args, targets):
    out = []
    for name,(n_in,hidden,bs),steps in (('tiny', TINY, args.steps*2), ('mid-size', MID, args.steps)):
        if args.quick: hidden = 16
        times = compare_loops(n_in, hidden, bs, steps, args.repeats, args.device, fabric=False)
        times = {k: v for k,v in times.items() if 'iterate' not in k}
        out += [f"\n{name}: MLP {n_in}-{hidden}-{hidden}-10, bs {bs}, AdamW, one torch DataLoader, {steps} steps x {args.repeats} repeats",
                table(times, 'Accelerate loop'),
                verdict(f'{name}: fastxtend_accel Learner / Accelerate loop', ratio(times, 'fastxtend_accel Learner', 'Accelerate loop'), 1.05, targets)]
        if name == 'tiny':
            out.append(verdict('tiny: fastxtend_accel Learner / torch loop (next target)', ratio(times, 'fastxtend_accel Learner', 'torch loop'), 1.10, targets))
    return out

def section_data(args, targets):
    n_in,hidden,bs = TINY
    steps = args.steps*2
    x,y = tensors(steps*bs, n_in)
    torch_dl = TorchDL(TensorDataset(x, y), batch_size=bs, shuffle=True, drop_last=True)
    tfmd = tfmd_dls(x, y, bs, len(x)).train
    model = partial(mlp, n_in, 16 if args.quick else hidden, args.device)
    runs = {'fastai Learner, torch DataLoader': learner_loop(model(), torch_dl),
            'fastxtend_accel Learner, torch DataLoader': learner_loop(model(), torch_dl, accelerate=True),
            'fastai Learner, TfmdDL': learner_loop(model(), tfmd),
            'fastxtend_accel Learner, TfmdDL': learner_loop(model(), tfmd, accelerate=True),
            'torch DataLoader (iterate)': iterate(torch_dl),
            'TfmdDL (iterate)': iterate(tfmd)}
    times = interleave(runs, args.repeats, per=steps)
    refs = {'fastxtend_accel Learner, torch DataLoader': 'fastai Learner, torch DataLoader', 'fastai Learner, TfmdDL': 'fastai Learner, torch DataLoader',
            'fastxtend_accel Learner, TfmdDL': 'fastai Learner, TfmdDL', 'TfmdDL (iterate)': 'torch DataLoader (iterate)'}
    return [f"\nfastai data: tiny MLP, bs {bs}, shuffled, the same {len(x)} items in a torch DataLoader and a TfmdDL, {steps} batches x {args.repeats} repeats",
            table(times, 'fastai Learner, torch DataLoader', unit='ms/batch', ratio_keys=[], refs=refs),
            verdict('TfmdDL epoch: fastxtend_accel Learner / fastai Learner', ratio(times, 'fastxtend_accel Learner, TfmdDL', 'fastai Learner, TfmdDL'), 1.03, targets)]

def eval_loop(model, dl, reduce=None):
    "The hand-written validation: mean loss over `dl` (summed over processes by `reduce`)"
    with torch.no_grad():
        tot,n = torch.zeros(()),torch.zeros(())
        for xb,yb in dl: tot,n = tot + F.cross_entropy(model(xb), yb, reduction='sum'),n + len(yb)
    if reduce is not None: tot,n = reduce(tot),reduce(n)
    return tot/n

def fits_loop(model, opt, train, valid, backward, n_fits, reduce=None):
    "`n_fits` epochs, each training on `train` then validating on `valid`, in one hand-written loop"
    step = step_loop(model, opt, train, backward)
    def run():
        for _ in range(n_fits):
            model.train(); step()
            model.eval(); eval_loop(model, valid, reduce)
    return run

def learner_fits(learn, n_fits):
    def run():
        with learn.no_bar(), learn.no_logging():
            for _ in range(n_fits): learn.fit(1)
    return run

def fits_runs(args, distributed=False):
    "Seconds of `n_fits` short fits for each variant; on several processes only the accelerated ones"
    n_in,hidden,bs = TINY
    hidden = 16 if args.quick else hidden
    n_train,n_valid,n_fits = 5,2,args.n_fits
    x,y = tensors((n_train+n_valid)*bs, n_in)
    ds = TensorDataset(x[:n_train*bs], y[:n_train*bs]),TensorDataset(x[n_train*bs:], y[n_train*bs:])
    train,valid = TorchDL(ds[0], batch_size=bs, shuffle=True, drop_last=True),TorchDL(ds[1], batch_size=bs)
    model = partial(mlp, n_in, hidden)
    runs = {}
    if not distributed: runs['fastai Learner'] = learner_fits(learner(model(), train, valid), n_fits)
    runs['fastxtend_accel Learner'] = learner_fits(learner(model(), train, valid, accelerate=True), n_fits)
    acc,m = Accelerator(cpu=distributed),model()
    m,opt,tdl,vdl = acc.prepare(m, adamw(m), train, valid)
    runs['Accelerate loop, one prepare'] = fits_loop(m, opt, tdl, vdl, acc.backward, n_fits, acc.reduce if distributed else None)
    if not distributed:
        m = model()
        runs['torch loop'] = fits_loop(m, adamw(m), train, valid, torch.Tensor.backward, n_fits)
    return runs,n_fits

def section_fits(args, targets):
    if args.live_objects: args._alive = [(i,) for i in range(args.live_objects)] # what a notebook holds: its garbage collections take longer
    runs,n_fits = fits_runs(args)
    times = interleave(runs, args.repeats, per=n_fits)
    return [f"\nmany short fits: {n_fits} x fit(1) of 5 training + 2 validation batches, tiny MLP, bs {TINY[2]}, {args.repeats} repeats"
            + (f", {args.live_objects} Python objects alive" if args.live_objects else ''),
            table(times, 'fastai Learner', unit='ms/fit'),
            f"fastxtend_accel Learner / Accelerate loop: {ratio(times, 'fastxtend_accel Learner', 'Accelerate loop, one prepare'):.3f}x",
            verdict('short fits: fastxtend_accel Learner / fastai Learner', ratio(times, 'fastxtend_accel Learner', 'fastai Learner'), 1.10, targets)]

MEM_VARIANTS = ('torch loop', 'Accelerate loop', 'fastai Learner', 'fastxtend_accel Learner')

def _status(key): return int(re.search(rf'{key}:\s+(\d+) kB', Path('/proc/self/status').read_text()).group(1))*1024

def memory_worker(args):
    "Peak memory of three epochs of `args.variant`, in this fresh process; prints one line of JSON"
    torch.set_num_threads(args.threads)
    n_in,hidden,bs = MID
    hidden = 16 if args.quick else args.mem_hidden
    x,y = tensors(args.mem_steps*bs, n_in)
    dl = TorchDL(TensorDataset(x, y), batch_size=bs, drop_last=True, pin_memory=args.device == 'cuda')
    m = mlp(8, 8, args.device) # warm up: torch loads its kernels and thread pools, which would count as growth
    step_loop(m, adamw(m), [(torch.randn(4, 8, device=args.device), torch.zeros(4, dtype=torch.long, device=args.device))], torch.Tensor.backward)()
    del m
    Path('/proc/self/clear_refs').write_text('5') # peak RSS starts again from here
    if args.device == 'cuda': torch.cuda.reset_peak_memory_stats()
    rss0 = _status('VmRSS')
    model = mlp(n_in, hidden, args.device)
    if 'Learner' in args.variant:
        learn = learner(model, dl, accelerate=args.variant == 'fastxtend_accel Learner', cbs=TrainTimer())
        with learn.no_bar(), learn.no_logging():
            for _ in range(3): learn.fit(1)
    else:
        from bench_loop import torch_loop, accelerate_loop
        run = (torch_loop if args.variant == 'torch loop' else accelerate_loop)(model, dl)
        for _ in range(3): run()
    res = dict(peak=_status('VmHWM'), start=rss0, gpu=torch.cuda.max_memory_allocated() if args.device == 'cuda' else None)
    print(json.dumps(res))

def section_memory(args, targets):
    res = {v: [] for v in MEM_VARIANTS}
    argv = ['--quick'] if args.quick else []
    for _ in range(args.mem_repeats):
        for v in MEM_VARIANTS:
            cmd = [sys.executable, __file__, '--memory-worker', v, '--mem-steps', str(args.mem_steps), '--mem-hidden', str(args.mem_hidden),
                   '--device', args.device, '--threads', str(args.threads), *argv]
            # a fixed mmap threshold: glibc then returns every freed tensor to the system, so RSS follows the live tensors,
            # not the order in which each variant happens to allocate and free them
            env = {**os.environ, 'PYTHONWARNINGS': 'ignore', 'MALLOC_MMAP_THRESHOLD_': '131072'}
            p = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            res[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
    mib = lambda b: b/2**20
    med = lambda v,f: statistics.median(f(r) for r in res[v])
    gpu = args.device == 'cuda'
    h = 16 if args.quick else args.mem_hidden
    rows = [f"\npeak memory: MLP 784-{h}-{h}-10, bs {MID[2]}, AdamW, 3 epochs of {args.mem_steps} steps, one fresh process each, "
            f"{args.mem_repeats} repeats (medians)",
            "| variant | peak RSS MiB | RSS growth while training MiB | growth vs Accelerate loop |" + (" max_memory_allocated MiB |" if gpu else ''),
            "|---|---|---|---|" + ('---|' if gpu else '')]
    grow = lambda r: r['peak'] - r['start']
    for v in MEM_VARIANTS:
        rows.append(f"| {v} | {mib(med(v, lambda r: r['peak'])):.1f} | {mib(med(v, grow)):.1f} | {med(v, grow)/med('Accelerate loop', grow):.3f}x |"
                    + (f" {mib(med(v, lambda r: r['gpu'])):.1f} |" if gpu else ''))
    key = (lambda r: r['gpu']) if gpu else (lambda r: r['peak'])
    rows.append(f"RSS growth, fastxtend_accel Learner / torch loop: {med('fastxtend_accel Learner', grow)/med('torch loop', grow):.3f}x")
    rows.append(verdict(f"peak memory ({'max_memory_allocated' if gpu else 'RSS'}): fastxtend_accel Learner / Accelerate loop",
                        med('fastxtend_accel Learner', key)/med('Accelerate loop', key), 1.05, targets))
    rows.append(verdict('RSS growth while training: fastxtend_accel Learner / Accelerate loop',
                        med('fastxtend_accel Learner', grow)/med('Accelerate loop', grow), 1.05, targets))
    return rows

_all_reduce = dist.all_reduce
COLLECTIVES = ('all_reduce', 'broadcast', 'all_gather', 'all_gather_into_tensor', 'broadcast_object_list', 'all_gather_object', 'barrier', 'reduce')
counts = {}

def _count_collectives():
    "Count the collectives called from Python (by the library, Accelerate, fastai), and optimizer steps"
    def counting(name, f):
        def _inner(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return f(*args, **kwargs)
        return _inner
    for name in COLLECTIVES: setattr(dist, name, counting(name, getattr(dist, name)))
    def on_step(opt, args, kwargs): counts['steps'] = counts.get('steps', 0) + 1
    register_optimizer_step_post_hook(on_step)

def _count_grad_allreduces(model):
    "Count the all-reduces of DDP's gradient buckets (DDP's own all-reduce, not counted among the other collectives)"
    def hook(state, bucket):
        counts['grad all-reduce'] = counts.get('grad all-reduce', 0) + 1
        t = bucket.buffer().div_(dist.get_world_size())
        return _all_reduce(t, async_op=True).get_future().then(lambda fut: fut.value()[0])
    model.register_comm_hook(None, hook)

class GradAllreduces(Callback):
    "Count DDP's gradient all-reduces in the model `AcceleratorCallback` wrapped for this fit"
    order = AcceleratorCallback.order+1
    def before_fit(self):
        model = self.learn.model
        if isinstance(model, nn.parallel.DistributedDataParallel) and not getattr(model, 'counted', False): # once per wrapper
            _count_grad_allreduces(model)
            model.counted = True

def counted(run, key, res):
    "`run`, with the collectives and steps of its last call kept in `res[key]`"
    def _inner():
        counts.clear()
        t = run()
        res[key] = dict(counts)
        return t
    return _inner

def cpu_timed(run):
    "`run`, timed by this process's CPU time: iterating a loader is this process's own work, which the other process disturbs on a shared machine"
    def _inner():
        start = time.process_time()
        run()
        return time.process_time() - start
    return _inner

def per_batch_of(dl, n):
    "Iterating all of `dl` (this process's CPU time), timed as if it had `n` batches: per-batch times of loaders of different lengths side by side"
    run = cpu_timed(iterate(dl))
    return lambda: run()*n/len(dl)

def ddp_worker(args):
    "The `ddp` section, in each of the processes torchrun started; rank 0 writes the results to `args.ddp_worker`"
    warnings.filterwarnings('ignore')
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    rank,world = acc.process_index,acc.num_processes
    _count_collectives()
    n_in,hidden,bs = TINY
    hidden = 16 if args.quick else hidden
    steps = args.steps*2 # per process
    x,y = tensors(steps*bs*world, n_in)
    ds = TensorDataset(x, y)
    model = partial(mlp, n_in, hidden)
    # the same shards: Accelerate gives process r the global batches r, r+world, ...; so does `ShardedDL`
    m = model()
    m,opt,dl = acc.prepare(m, adamw(m), TorchDL(ds, batch_size=bs, drop_last=True))
    _count_grad_allreduces(m)
    res = {}
    runs = {'Accelerate DDP loop': counted(step_loop(m, opt, dl, acc.backward), 'Accelerate DDP loop', res)}
    runs['fastxtend_accel Learner'] = counted(learner_loop(model(), TorchDL(ds, batch_size=bs, drop_last=True), accelerate=True, cbs=GradAllreduces()),
                                              'fastxtend_accel Learner', res)
    tfmd = tfmd_dls(x, y, bs, len(x)).train # every item, as each process builds it; `ShardedDL` gives this process its share
    sharded = ShardedDL(tfmd, rank=rank, world_size=world)
    runs |= {'the TfmdDL alone (iterate)': per_batch_of(tfmd, steps),
             'ShardedDL over the TfmdDL (iterate)': counted(cpu_timed(iterate(sharded)), 'ShardedDL over the TfmdDL (iterate)', res),
             'Accelerate DataLoaderShard (iterate)': cpu_timed(iterate(dl)), # the hand-written loop's loader
             'ShardedDL over the torch DataLoader (iterate)': cpu_timed(iterate(shard_dl(TorchDL(ds, batch_size=bs, drop_last=True), acc)))}
    def barrier_first(run):
        def _inner():
            dist.barrier()
            return run()
        return _inner
    times = interleave({k: barrier_first(r) for k,r in runs.items()}, args.repeats, per=steps)
    fruns,n_fits = fits_runs(args, distributed=True)
    ftimes = interleave({k: barrier_first(r) for k,r in fruns.items()}, max(1, args.repeats//2), per=n_fits)
    if rank == 0:
        Path(args.ddp_worker).write_text(json.dumps(dict(times=times, fits=ftimes, counts=res, steps=steps, world=world, n_fits=n_fits,
                                                         batches=len(sharded))))

def section_ddp(args, targets):
    with tempfile.TemporaryDirectory() as d:
        out = f'{d}/ddp.json'
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', __file__, '--ddp-worker', out,
               '--steps', str(args.steps), '--repeats', str(args.repeats), '--n-fits', str(args.n_fits), *(['--quick'] if args.quick else [])]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'PYTHONWARNINGS': 'ignore', 'OMP_NUM_THREADS': '1'})
        if not Path(out).exists(): raise RuntimeError(f"the 2-process run wrote no results (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        r = json.loads(Path(out).read_text())
    times,c,steps = r['times'],r['counts'],r['steps']
    learn,loop = c['fastxtend_accel Learner'],c['Accelerate DDP loop']
    other = lambda d: {k: v for k,v in d.items() if k not in ('steps', 'grad all-reduce')}
    rows = [f"\n2 processes (torchrun, gloo, 1 thread each; training: wall clock, waits included; loaders iterated alone: CPU time): tiny MLP, bs {TINY[2]} per process, the same shards, {steps} batches per process x {args.repeats} repeats",
            table(times, 'Accelerate DDP loop', unit='ms/batch', ratio_keys=['fastxtend_accel Learner'],
                  refs={'ShardedDL over the TfmdDL (iterate)': 'the TfmdDL alone (iterate)',
                        'ShardedDL over the torch DataLoader (iterate)': 'Accelerate DataLoaderShard (iterate)'}),
            "\n| per epoch, process 0 | optimizer steps | gradient all-reduces (DDP buckets) | other collectives |", "|---|---|---|---|"]
    for k,v in (('Accelerate DDP loop', loop), ('fastxtend_accel Learner', learn), ('ShardedDL over the TfmdDL (iterate)', c['ShardedDL over the TfmdDL (iterate)'])):
        rows.append(f"| {k} | {v.get('steps', 0)} | {v.get('grad all-reduce', 0)} | {other(v) or '-'} |")
    rows.append(f"\n{r['n_fits']} x fit(1) of 5 batches on 2 processes (ms/fit):")
    rows.append(table(r['fits'], 'Accelerate loop, one prepare', unit='ms/fit'))
    rows.append(verdict('2 processes: fastxtend_accel Learner / Accelerate DDP loop', ratio(times, 'fastxtend_accel Learner', 'Accelerate DDP loop'), 1.05, targets))
    ok = learn.get('grad all-reduce') == learn.get('steps') == steps
    rows.append(f"target: 2 processes: gradient all-reduces == optimizer steps: {learn.get('grad all-reduce')} == {learn.get('steps')} -> {'PASS' if ok else 'FAIL'}")
    targets.append(('2 processes: gradient all-reduces == optimizer steps', f"{learn.get('grad all-reduce')} == {learn.get('steps')}", ok))
    rows.append(f"collectives besides DDP's per epoch: Learner {sum(other(learn).values())}, Accelerate DDP loop {sum(other(loop).values())} "
                "(the Learner averages the smooth loss over processes once per epoch, and broadcasts a shuffled epoch's order)")
    rows.append(verdict('2 processes: ShardedDL over a TfmdDL / the TfmdDL alone', ratio(times, 'ShardedDL over the TfmdDL (iterate)', 'the TfmdDL alone (iterate)'), 1.02, targets))
    return rows

SECTIONS = dict(models=section_models, data=section_data, fits=section_fits, memory=section_memory, ddp=section_ddp)

def summary(targets):
    rows = ["\n| target (issue 12) | measured | limit | result |", "|---|---|---|---|"]
    for name,value,limit in targets:
        if isinstance(limit, bool): rows.append(f"| {name} | {value} | | {'PASS' if limit else 'FAIL'} |")
        else: rows.append(f"| {name} | {value:.3f}x | {limit}x | {'PASS' if value <= limit else 'FAIL'} |")
    return '\n'.join(rows)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--sections', nargs='+', default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument('--quick', action='store_true', help='tiny sizes and one repeat, to check that every section runs')
    p.add_argument('--repeats', type=int, default=9)
    p.add_argument('--steps', type=int, default=100, help='batches per timed epoch (the tiny model runs twice as many)')
    p.add_argument('--n-fits', type=int, default=20)
    p.add_argument('--mem-hidden', type=int, default=2048, help="the memory section's MLP width: weights, gradients and AdamW's state dominate")
    p.add_argument('--mem-steps', type=int, default=20)
    p.add_argument('--mem-repeats', type=int, default=3)
    p.add_argument('--live-objects', type=int, default=0, help='Python objects kept alive during `fits`, as a notebook holds them')
    p.add_argument('--threads', type=int, default=1, help='torch threads of the 1-process sections')
    p.add_argument('--clock', choices=['wall', 'cpu'], help="default: 'cpu' (this process's CPU time) on a CPU with 1 thread, else 'wall'; "
                   "the 2-process section times training with the wall clock")
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--memory-worker'), p.add_argument('--ddp-worker')
    args = p.parse_args()
    if args.quick: args.repeats,args.steps,args.n_fits,args.mem_repeats,args.mem_steps = 1,4,2,1,4
    if args.memory_worker: args.variant = args.memory_worker; return memory_worker(args)
    if args.ddp_worker: return ddp_worker(args)
    warnings.filterwarnings('ignore')
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ('cpu' if args.device == 'cpu' and args.threads == 1 else 'wall')
    use_clock(args.clock)
    print(f"{os.cpu_count()} CPUs, {args.threads} threads, torch {torch.__version__}, device {args.device}, {args.repeats} interleaved repeats, "
          f"{args.clock} clock")
    targets = []
    for s in args.sections: print('\n'.join(SECTIONS[s](args, targets)), flush=True)
    print(summary(targets))

if __name__ == '__main__': main()

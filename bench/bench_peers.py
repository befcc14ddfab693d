"""Peers side by side: each framework's training loop as its users write it, on one workload, in fresh processes.

    .venv/bin/python bench/bench_peers.py --repeats 3  # all runners, 1 and 2 processes, models A, B, C: ~40 min, 2 CPUs
    .venv/bin/python bench/bench_peers.py --procs 1 --models A --repeats 3 --runners torch accelerate accel   # ~1 min
    .venv/bin/python bench/bench_peers.py --calls       # function calls per step instead (cProfile, 1 process): ~4 min

Workload: scikit-learn's digits repeated 16 times (28,752 items; if scikit-learn is missing, random data of that shape
from a fixed seed), model A an MLP 64-256-256-10, model B a small CNN on the 8x8 images, model C a mid-size MLP
64-1024-1024-1024-10, AdamW (torch's defaults), batches of 64 per process, one thread per process. Each run is a fresh
process (or 2, started by torchrun) that trains 20 warm-up batches, then one whole epoch, timed on rank 0 by the wall
clock and by the process's CPU time. Runs are interleaved: each repeat runs every (runner, processes, model) once, in an
order rotated from repeat to repeat. Tables give medians of ms per optimizer step, min-max, ratios of medians to the
hand-written Accelerate loop and to the plain torch loop, and, so that a broken runner can't look fast, the steps of the
timed epoch and the loss and accuracy of the trained model on the training data. Issue 27's targets are judged on the
ratio of CPU-time medians; beside it, the median of the ratios within a repeat (runs minutes apart, not the run's drift),
the ratio of the fastest runs, and on several processes the same of the job's CPU time, the mean of its processes'
(process 0's own CPU time leaves out what the others do and counts how it waits for them: a loop whose process 0 sleeps
longer in the all-reduce looks cheaper there). On a shared machine a slow one-process run is as slow in CPU time as in
wall time (the two agree to 0.1%): CPU time doesn't take the machine's noise out, so read a median of a few runs against
the min-max beside it.

Runners (`--runners`; `peer_runners.py` writes them): `torch` (DDP on 2 processes), `accelerate`, stock `fastai`
(1 process only: fastai 2.8.12's `DistributedDL` calls `.cuda()`), fastxtend_accel's accelerated `Learner` over four
kinds of fastai loaders (`accel`: `DataLoaders.from_dsets`, `accel-datasets`: `Datasets`, `accel-datablock`:
`DataBlock`, `accel-torchdl`: torch `DataLoader`s in `DataLoaders`), the same over `from_dsets` with the loss and metric
fastai users write (`accel-idiom`: `CrossEntropyLossFlat()`, `accuracy`), Lightning's `trainer` and `fabric`. Stock
fastai over the other loaders (`fastai-datasets`, `fastai-datablock`, `fastai-torchdl`) and with fastai's loss
(`fastai-idiom`) runs when named. fastxtend_accel is
imported from where Python finds it: set `PYTHONPATH` to time another copy (the header says which one ran).

Lightning is a benchmark-only dependency, never installed in `.venv`: its runners run with `--lightning-python` (or
`$FASTXTEND_BENCH_LIGHTNING_PYTHON`), by default the python of a venv made once with `.venv`'s torch (the CPU build, no
CUDA wheels) and no torchvision (torchmetrics imports it if it can, and the CUDA-built wheel fails beside CPU torch):

    python3 -m venv ~/.cache/fastxtend_accel/venv-bench
    ~/.cache/fastxtend_accel/venv-bench/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    ~/.cache/fastxtend_accel/venv-bench/bin/pip install torch==2.13.0 lightning==2.6.6

Without it the Lightning rows are skipped, with the reason. `--calls` profiles 200 steps after 20 warm-up batches on 1
process and gives the calls per step, all (builtins counted with the package that called them) and Python functions.
"""
import argparse, cProfile, json, os, random, statistics, subprocess, sys, tempfile, time, warnings
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from peer_runners import BS

HERE = Path(__file__).resolve()
RUNNERS = {'torch': 'torch loop', 'accelerate': 'Accelerate loop', 'fastai': 'fastai Learner, from_dsets',
           'fastai-datasets': 'fastai Learner, Datasets', 'fastai-datablock': 'fastai Learner, DataBlock',
           'fastai-torchdl': 'fastai Learner, torch DataLoader', 'accel': 'fastxtend_accel Learner, from_dsets',
           'accel-datasets': 'fastxtend_accel Learner, Datasets',
           'accel-datablock': 'fastxtend_accel Learner, DataBlock',
           'accel-torchdl': 'fastxtend_accel Learner, torch DataLoader',
           'fastai-idiom': 'fastai Learner, from_dsets, fastai loss', 'accel-idiom': 'fastxtend_accel Learner, fastai loss',
           'trainer': 'Lightning Trainer',
           'fabric': 'Lightning Fabric'}
DEFAULT = [k for k in RUNNERS if k not in ('fastai-datasets', 'fastai-datablock', 'fastai-torchdl', 'fastai-idiom')]
LIGHTNING = ('trainer', 'fabric')
ONE_PROCESS = {k: "fastai 2.8.12's DistributedDL calls .cuda(), so stock fastai can't train on several CPU processes"
               for k in RUNNERS if k.startswith('fastai')}
LIGHTNING_VENV = Path.home()/'.cache'/'fastxtend_accel'/'venv-bench'
WARMUP,CALL_STEPS = 20,200
MODELS = 'model A: MLP 64-256-256-10, B: CNN conv16-conv32/2-linear, C: MLP 64-1024-1024-1024-10'

# ---- in each run's processes

def models():
    "Model A, an MLP on the 64 pixels as a vector, B, a small CNN on them as a 1x8x8 image, and C, a mid-size MLP"
    from torch import nn
    return dict(A=lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                        nn.Linear(256, 10)),
                C=lambda: nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)),
                B=lambda: nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                                        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                        nn.Flatten(), nn.Linear(32*4*4, 10)))

class Clock:
    "Wall-clock and CPU seconds of the timed epoch in this process, the optimizer steps in it, and its profile if asked"
    def __init__(self, profile=False):
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self.prof,self.all_steps,self.get_threads = cProfile.Profile() if profile else None,0,torch.get_num_threads
        register_optimizer_step_post_hook(self._count)
    def _count(self, opt, args, kwargs): self.all_steps += 1
    def start(self):
        self.steps,self.threads = self.all_steps,self.get_threads()
        self.wall,self.cpu = time.perf_counter(),time.process_time()
        if self.prof: self.prof.enable()
    def stop(self):
        if self.prof: self.prof.disable()
        self.wall,self.cpu = time.perf_counter() - self.wall,time.process_time() - self.cpu
        self.steps = self.all_steps - self.steps
    def __call__(self, epoch):
        "Time the block if it is epoch 1 (`with clock(epoch):` around a hand-written epoch)"
        return self._timed() if epoch == 1 else nullcontext()
    @contextmanager
    def _timed(self):
        self.start()
        yield
        self.stop()

def _package(fn):
    "Who a profiled function belongs to: its package, 'runner' for `peer_runners.py`, 'python' for the rest"
    parts = Path(fn).parts
    if 'site-packages' in parts: return parts[parts.index('site-packages')+1].split('.')[0]
    if 'fastxtend_accel' in parts: return 'fastxtend_accel'
    return 'runner' if Path(fn).name == 'peer_runners.py' else 'python'

def call_counts(prof, steps):
    "Calls per step in `prof` but this file's: all, Python functions only, and by package (a builtin with its caller's)"
    import pstats
    by,py = {},0
    def add(k, n): by[k] = by.get(k, 0) + n/steps
    for (fn,_,_),(_,nc,_,_,callers) in pstats.Stats(prof).stats.items():
        if fn == str(HERE): continue # the step counter and the clock
        if fn != '~':
            py += nc/steps
            add(_package(fn), nc)
        else:
            for (cfn,_,_),(_,cnc,_,_) in callers.items():
                if cfn != str(HERE): add('python' if cfn == '~' else _package(cfn), cnc)
    return dict(total=sum(by.values()), python=py, by=by)

def evaluate(model, x, y):
    "Loss and accuracy of `model` on `x`, `y`"
    import torch, torch.nn.functional as F
    with torch.no_grad(): out = torch.cat([model(xb) for xb in x.split(4096)])
    return F.cross_entropy(out, y).item(),(out.argmax(1) == y).float().mean().item()

def runner_fn(key):
    "The function of `peer_runners` that runs `key`"
    import peer_runners as pr
    loops = dict(torch=pr.torch_loop, accelerate=pr.accelerate_loop, fabric=pr.fabric_loop,
                 trainer=pr.lightning_trainer)
    if key in loops: return loops[key]
    kind,_,loader = key.partition('-')
    return partial(pr.fastai_learner, accelerate=kind == 'accel', idiomatic=loader == 'idiom',
                   loader=dict(datasets='Datasets', datablock='DataBlock', torchdl='torch').get(loader, 'from_dsets'))

def worker(args):
    "One run of `args.worker`: train, then on rank 0 write the timings and the check of the trained model to `args.out`"
    import torch
    warnings.filterwarnings('ignore')
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if args.worker in LIGHTNING: sys.modules['torchvision'] = None # torchmetrics imports it if it can; none is needed
    data = torch.load(args.data)
    n = args.items or len(data['x'])
    shape = (-1, 1, 8, 8) if args.model == 'B' else (-1, 64)
    x,y,xv,yv = data['x'][:n].view(shape),data['y'][:n],data['xv'].view(shape),data['yv']
    random.seed(0)
    torch.manual_seed(0)
    model = models()[args.model]()
    loss0,_ = evaluate(model, x, y)
    clock = Clock(profile=args.profile)
    runner_fn(args.worker)(model, x, y, xv, yv, WARMUP, clock) # trains `model` in place: wrappers share its parameters
    if (rank := int(os.environ.get('RANK', 0))) != 0: # the other processes' clocks, for the job's CPU time
        return Path(f'{args.out}.{rank}').write_text(json.dumps(dict(cpu=clock.cpu, steps=clock.steps)))
    loss,acc = evaluate(model, x, y)
    res = dict(wall=clock.wall, cpu=clock.cpu, steps=clock.steps, threads=clock.threads, loss0=loss0, loss=loss,
               acc=acc)
    if args.profile: res['calls'] = call_counts(clock.prof, clock.steps)
    Path(args.out).write_text(json.dumps(res))

# ---- in the parent process

def make_data(path):
    "Digits x16 to train on, and the 1,797 digits as a held-out set for the loaders that want one, saved in `path`"
    import torch
    try:
        from sklearn.datasets import load_digits
        x,y = load_digits(return_X_y=True)
        x,y,source = torch.tensor(x, dtype=torch.float32)/16,torch.tensor(y),"scikit-learn's digits"
    except ImportError:
        g = torch.Generator().manual_seed(0)
        x,y = torch.randint(0, 17, (1797, 64), generator=g).float()/16,torch.randint(0, 10, (1797,), generator=g)
        source = 'random 8x8 images and labels, seed 0 (scikit-learn is not installed)'
    torch.save(dict(x=x.repeat(16, 1), y=y.repeat(16), xv=x, yv=y), path)
    return f"{source} x16: {16*len(x):,} items"

def lightning_python(path):
    "The python that runs the Lightning runners and what it has, or None and why not"
    py = Path(path) if path else LIGHTNING_VENV/'bin'/'python'
    if not py.exists(): return None,f"no {py}: make it as this script's docstring says, or give --lightning-python"
    check = ("import sys; sys.modules['torchvision'] = None; import lightning, torch; "
             "print(f'lightning {lightning.__version__}, torch {torch.__version__}')")
    res = subprocess.run([py, '-c', check], capture_output=True, text=True)
    if res.returncode: return None,f"{py} can't import lightning: {(res.stderr.strip().splitlines() or ['?'])[-1]}"
    return str(py),res.stdout.strip()

def launch(runner, procs, model, args, py, out):
    "Run `runner` once in fresh processes; what rank 0 wrote, or the error"
    cmd = [str(HERE), '--worker', runner, '--model', model, '--data', args.data, '--out', str(out)]
    if args.calls: cmd += ['--profile', '--items', str(CALL_STEPS*BS)]
    if procs > 1: cmd = ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(procs), *cmd]
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONWARNINGS': 'ignore'}
    proc = subprocess.Popen([py, *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try: log = proc.communicate(timeout=args.timeout)[0]
    except subprocess.TimeoutExpired:
        from fastxtend_accel.launching import kill_group
        kill_group(proc) # torchrun's workers too, in sessions of their own
        log = proc.communicate()[0] + f'\n(killed after {args.timeout} s)'
    tail = '\n'.join(log.strip().splitlines()[-15:])
    others = [Path(f'{out}.{r}') for r in range(1, procs)] # the other processes' clocks
    clocks = [f.read_text() for f in others if f.exists()]
    for f in others: f.unlink(missing_ok=True)
    if not out.exists(): return dict(error=f"exit {proc.returncode}:\n" + tail)
    res = json.loads(out.read_text()) # judged by what rank 0 wrote: gloo runs may abort at exit after their work
    out.unlink()
    try: res['cpu_all'] = job_cpu(res, [json.loads(o) for o in clocks], procs)
    except (ValueError, ZeroDivisionError) as e: return dict(error=f"exit {proc.returncode}, {e}:\n" + tail)
    return res

def job_cpu(res, clocks, procs):
    "The job's CPU time over process 0's steps: the mean of its `procs` processes' (`res` process 0's, `clocks` the rest)"
    if len(clocks) != procs-1: raise ValueError(f'{procs-1-len(clocks)} of the other processes wrote no times')
    return (res['cpu'] + sum(o['cpu']/o['steps']*res['steps'] for o in clocks))/procs

def per_step(runs, k): return [r[k]/r['steps']*1e3 for r in runs]

def med(xs): return statistics.median(xs)

def table(results, procs, model, keys):
    "Markdown table of one (processes, model): medians of ms per step, ratios, steps and the trained model's loss"
    ok = {k: [r for r in results.get((procs, model, k), []) if 'error' not in r] for k in keys}
    meds = {k: {c: med(per_step(ok[k], c)) for c in ('wall', 'cpu', 'cpu_all')} for k in keys if ok[k]}
    def ratio(k, ref, c): return f"{meds[k][c]/meds[ref][c]:.3f}x" if ref in meds else '-'
    loss0 = next((r['loss0'] for k in keys for r in ok[k]), float('nan'))
    many = procs > 1 # the job's CPU time too
    rows = [f"\n{procs} process{'es' if procs > 1 else ''}, model {model}: ms per optimizer step in the timed epoch "
            f"(median of runs, min-max), ratios of medians; loss and accuracy on the training data after it (before: "
            f"loss {loss0:.3f})",
            f"| {'runner':<41} | runs | steps | wall | min-max | vs Accelerate | vs torch | CPU | min-max "
            "| vs Accelerate | vs torch |" + (" CPU, mean of processes | vs Accelerate |" if many else '')
            + " loss | accuracy |", '|' + '---|'*(13 + 2*many)]
    for k in keys:
        if k not in meds:
            rows.append(f"| {RUNNERS[k]:<41} | 0 | failed |" + ' |'*(10 + 2*many))
            continue
        w,c = per_step(ok[k], 'wall'),per_step(ok[k], 'cpu')
        steps = '/'.join(sorted({str(r['steps']) for r in ok[k]}))
        rows.append(f"| {RUNNERS[k]:<41} | {len(ok[k])} | {steps} | {meds[k]['wall']:.3f} | {min(w):.3f}-{max(w):.3f} "
                    f"| {ratio(k, 'accelerate', 'wall')} | {ratio(k, 'torch', 'wall')} | {meds[k]['cpu']:.3f} "
                    f"| {min(c):.3f}-{max(c):.3f} | {ratio(k, 'accelerate', 'cpu')} | {ratio(k, 'torch', 'cpu')} "
                    + (f"| {meds[k]['cpu_all']:.3f} | {ratio(k, 'accelerate', 'cpu_all')} " if many else '') +
                    f"| {med([r['loss'] for r in ok[k]]):.3f} | {med([r['acc'] for r in ok[k]]):.3f} |")
    bad = {RUNNERS[k] for k in keys for r in ok[k] if r['loss'] >= r['loss0'] or r['threads'] != 1 or not r['steps']}
    if bad: rows.append(f"CHECK: a run of {', '.join(sorted(bad))} did not train (no steps, or its loss did not go "
                        "down) or ran with more than one thread")
    return '\n'.join(rows)

def calls_table(results, model, keys):
    "Markdown table of the calls per training step of each runner"
    rows = [f"\nmodel {model}, 1 process: calls per step over {CALL_STEPS} steps after {WARMUP} warm-up batches "
            "(cProfile; 'all' counts builtins, each with the package that called it)",
            f"| {'runner':<41} | all calls/step | Python functions/step | all vs torch | all, by package |",
            '|' + '---|'*5]
    ref = results.get((1, model, 'torch'), [{}])[0].get('calls')
    for k in keys:
        cs = results.get((1, model, k), [{}])[0].get('calls')
        if cs is None:
            rows.append(f"| {RUNNERS[k]:<41} | failed | | | |")
            continue
        by = ', '.join(f"{p} {n:.0f}" for p,n in sorted(cs['by'].items(), key=lambda o: -o[1]) if n >= 0.5)
        vs = f"{cs['total']/ref['total']:.2f}x" if ref else '-'
        rows.append(f"| {RUNNERS[k]:<41} | {cs['total']:.0f} | {cs['python']:.0f} | {vs} | {by} |")
    return '\n'.join(rows)

FASTAI_LOADERS = ('accel', 'accel-datasets', 'accel-datablock')
TARGETS = ([('A', k, 'fabric', 1.10) for k in FASTAI_LOADERS] + [('A', k, 'trainer', 1.00) for k in FASTAI_LOADERS] +
           [('A', 'accel-torchdl', 'fabric', 1.05)] + [(m, 'accel', 'accelerate', 1.03) for m in ('B', 'C')] +
           [('A', 'accel-idiom', 'fabric', 1.05)]) # the last: issue 43, fastai's own loss and a metric

def paired(results, n, m, k, ref, c='cpu'):
    "Median over repeats of `k`'s time over `ref`'s in the same repeat (minutes apart, not the whole run's drift)"
    pairs = [(a, b) for a,b in zip(results.get((n, m, k), []), results.get((n, m, ref), []))
             if 'error' not in a and 'error' not in b]
    return med([a[c]/a['steps']/(b[c]/b['steps']) for a,b in pairs]) if pairs else float('nan')

def targets(results, procs, models):
    "Issues 27 and 43's targets from the medians of one interleaved run, judged on CPU time (a shared machine's wall wanders)"
    rows = ['\n| target (issues 27, 43) | processes | wall | CPU | CPU, paired | CPU, fastest | CPU, mean of processes '
            '| mean of processes, paired | limit | result |', '|' + '---|'*10]
    def clocks(n, m, k):
        ok = [r for r in results.get((n, m, k), []) if 'error' not in r]
        return [med(per_step(ok, c)) for c in ('wall', 'cpu', 'cpu_all')] + [min(per_step(ok, 'cpu'))] if ok else None
    for m,k,ref,limit in TARGETS:
        for n in procs:
            if m not in models or (a := clocks(n, m, k)) is None or (b := clocks(n, m, ref)) is None: continue
            w,c,c_all,fast = [o/p for o,p in zip(a, b)]
            rows.append(f"| {RUNNERS[k]} / {RUNNERS[ref]}, model {m} | {n} | {w:.3f}x | {c:.3f}x "
                        f"| {paired(results, n, m, k, ref):.3f}x | {fast:.3f}x | {c_all:.3f}x "
                        f"| {paired(results, n, m, k, ref, 'cpu_all'):.3f}x | {limit:.2f}x "
                        f"| {'PASS' if c <= limit else 'FAIL'} |")
    if len(rows) > 2: rows.append("(result: the ratio of CPU medians of the first process; paired: the median of the "
                                  "ratios within a repeat; fastest: of the fastest runs; mean of processes: of the mean "
                                  "of the processes' CPU times)")
    return '\n'.join(rows) if len(rows) > 2 else ''

def progress(r):
    if 'error' in r: return r['error'].splitlines()[0] + ' (the output is at the end)'
    return (f"{r['wall']/r['steps']*1e3:.3f} ms/step wall, {r['cpu']/r['steps']*1e3:.3f} CPU, {r['steps']} steps, "
            f"loss {r['loss']:.3f}" + (f", {r['calls']['total']:.0f} calls/step (profiled)" if 'calls' in r else ''))

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--runners', nargs='+', default=DEFAULT, choices=list(RUNNERS), metavar='RUNNER',
                   help=f"some of {', '.join(RUNNERS)} (default: all but fastai-datasets, -datablock and -torchdl)")
    p.add_argument('--procs', nargs='+', type=int, default=[1, 2], help='processes per run')
    p.add_argument('--models', nargs='+', default=['A', 'B', 'C'], choices=['A', 'B', 'C'])
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--calls', action='store_true', help='count calls per step instead of timing (1 process, 1 run)')
    p.add_argument('--lightning-python', default=os.environ.get('FASTXTEND_BENCH_LIGHTNING_PYTHON'),
                   help=f'python with lightning, for the Lightning runners (default: {LIGHTNING_VENV}/bin/python)')
    p.add_argument('--timeout', type=float, default=600, help='seconds a run may take')
    for hidden in ('--worker', '--model', '--data', '--out'): p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument('--items', type=int, help=argparse.SUPPRESS)
    p.add_argument('--profile', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker: return worker(args)
    start = time.time()
    import torch, fastai, accelerate, fastxtend_accel
    procs,repeats = ([1],1) if args.calls else (args.procs,args.repeats)
    keys = [k for k in RUNNERS if k in args.runners]
    lpy,linfo = lightning_python(args.lightning_python) if set(keys) & set(LIGHTNING) else (None,None)
    if lpy is None and linfo: print(f"(Lightning runners skipped: {linfo})")
    keys = [k for k in keys if lpy or k not in LIGHTNING]
    for k in keys:
        if k in ONE_PROCESS and max(procs) > 1: print(f"({RUNNERS[k]}: 1 process only: {ONE_PROCESS[k]})")
    configs = [(n, m, k) for n in procs for m in args.models for k in keys if n == 1 or k not in ONE_PROCESS]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        args.data = f'{tmp}/data.pt'
        measured = f'{CALL_STEPS} steps profiled' if args.calls else 'one epoch timed'
        print('; '.join([make_data(args.data), MODELS,
                         f'AdamW, bs {BS} per process, {WARMUP} warm-up batches, then {measured}',
                         f'1 thread per process, {os.cpu_count()} CPUs', f'torch {torch.__version__}',
                         f'fastai {fastai.__version__}', f'accelerate {accelerate.__version__}',
                         f'fastxtend_accel {fastxtend_accel.__version__} ({Path(fastxtend_accel.__file__).parent})',
                         *([f'{linfo} ({lpy})'] if lpy else [])]), flush=True)
        for rep in range(repeats):
            shift = rep*len(configs)//repeats
            for n,m,k in configs[shift:] + configs[:shift]:
                r = launch(k, n, m, args, lpy if k in LIGHTNING else sys.executable, Path(tmp)/'out.json')
                results.setdefault((n, m, k), []).append(r)
                print(f"repeat {rep+1}/{repeats}: {n}p {m} {RUNNERS[k]}: {progress(r)}", flush=True)
    for m in args.models:
        if args.calls: print(calls_table(results, m, keys))
        else:
            for n in procs: print(table(results, n, m, [k for k in keys if n == 1 or k not in ONE_PROCESS]))
    if not args.calls: print(targets(results, procs, args.models))
    for (n,m,k),runs in results.items():
        if errs := [r['error'] for r in runs if 'error' in r]:
            print(f"\n{RUNNERS[k]}, {n} process(es), model {m}: {len(errs)} of {len(runs)} runs failed; "
                  f"the first:\n{errs[0]}")
    print(f"\n{len(configs)*repeats} runs in {(time.time() - start)/60:.1f} min")

if __name__ == '__main__': main()

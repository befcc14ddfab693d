"""The compatibility matrix's cells (`fastxtend_accel.compatibility`), run on the processes of this launch.

`matrix_cells.py OUT LAUNCH`: OUT/LAUNCH.json lists the jobs `[kind, cell]` of this launch (`compatibility.plan`) for
its number of processes (1: `python`, 2: `torchrun`). Each job runs in a process forked from this one, which has
imported everything and trained nothing: a fresh start for each cell, as a user's script has, and a cell that fails or
hangs can't harm the next. On 2 processes each rank forks its own, and the two meet in a process group of their own (a
file store in OUT). Kinds:
- `reference`: the cell's learner, as stock fastai trains it (in bf16: `.accelerate()` on 1 process);
- `straight`: the cell as asked, uninterrupted;
- `kill`: the cell checkpointing every 3 steps, SIGKILLed by itself after its 8th batch;
- `resume`: the killed cell resumed from its newest checkpoint (on the other number of processes for `elastic`
  cells).
Each rank writes OUT/KIND-ID-rankR.pt: the parameters (full) and `Recorder` values, or the error, where it was raised
and whether the learner was left as it was; its output goes to OUT/KIND-ID-rankR.log.
"""
import os, sys, json, signal, time, traceback
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import *
from fastai.callback.all import *
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.tensor import DTensor
from fastxtend_accel.core import *
from fastxtend_accel.compiler import *
from fastxtend_accel.ema import EMACallback
from fastxtend_accel.guard import NonFiniteGuardCallback
from fastxtend_accel.monitors import *
from fastxtend_accel.checkpoint import CheckpointCallback
from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
from fastxtend_accel.test_utils import app_learners
from fastxtend_accel.compatibility import cell_id

defaults.callbacks = [cb for cb in defaults.callbacks if cb is not ProgressCallback] # no bars in the logs

LRS = dict(tabular=1e-2, collab=5e-2, text=3e-2, lm=1e-2, images=1e-2)
GLOBAL_BS,KILL_AFTER = 32,8
# no dropout: cells comparable to the bit (fastai's AWD_LSTM needs a `weight_p` > 0: 1e-12 drops no weight, in practice)
NO_DROPOUT = dict(text=dict(weight_p=1e-12), lm=dict(weight_p=1e-12))
COMPILE_BACKEND = os.environ.get('MATRIX_BACKEND', 'aot_eager')

def full(t): return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().clone()
def snapshot(learn):
    "The model's class, and each parameter as this process holds it: its kind, its values (none in `sharded_init`)"
    def local(p): return None if p.is_meta else (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
    return [(type(learn.model).__name__, None)] + [(type(p).__name__, local(p)) for p in learn.model.parameters()]

def same(a, b):
    "Whether two snapshots hold the same kinds of parameters with the same values"
    def eq(x, y): return x is y is None or (x is not None and y is not None and torch.equal(x, y))
    return len(a) == len(b) and all(k == l and eq(x, y) for (k,x),(l,y) in zip(a, b))

class KillAt(Callback):
    "SIGKILL this process after training batch `n` of the fit (counted over epochs), once its checkpoint is written"
    order = CheckpointCallback.order+1
    def __init__(self, n, marker): self.n,self.marker,self.seen = n,marker,0
    def after_batch(self):
        if not self.training: return
        self.seen += 1
        if self.seen == self.n:
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

class Progress(Callback):
    "Training batches run so far (0: the fit failed before changing anything)"
    order = -100
    def __init__(self): self.batches = 0
    def before_fit(self): self.batches = 0
    def after_batch(self):
        if self.training: self.batches += 1

def _layer(learner): return dict(collab=nn.Embedding, images=nn.Conv2d).get(learner, True)

def make(cell, world):
    "The cell's learner on `world` processes, as fastai users build it (in `sharded_init` for FSDP2's `sharded` cells)"
    fn,kw = app_learners[cell["learner"]],dict(bs=GLOBAL_BS//world, **NO_DROPOUT.get(cell["learner"], {}))
    if cell['strategy'] == 'sharded' and world > 1:
        with sharded_init(): return fn(**kw)
    return fn(**kw)

def ask(learn, cell, world, kind, out):
    "Set the cell's options on `learn` as a user does; the callbacks to fit with"
    cbs = []
    if cell['step'] == 'grad_accum': cbs.append(GradientAccumulation(n_acc=2*GLOBAL_BS))
    if cell['callbacks'] == 'ema': cbs.append(EMACallback(decay=0.9))
    if cell['callbacks'] == 'guard': cbs.append(NonFiniteGuardCallback())
    if kind == 'reference': # stock fastai (bf16 has no stock path on a CPU: `.accelerate()` on 1 process)
        if cell['precision'] == 'bf16': learn.accelerate(mixed_precision='bf16')
        return cbs
    if cell['callbacks'] == 'monitors': learn.monitor()
    if cell['compile'] != 'off': learn.compile(regional=cell['compile'] == 'regional', backend=COMPILE_BACKEND)
    kw = dict(mixed_precision='no' if cell['precision'] == 'fp32' else cell['precision'])
    if cell['callbacks'] == 'monitors': kw.update(log_with='tensorboard', project_dir=out/f'tb-{kind}-{cell_id(cell)}')
    opts = {}
    if cell['step'] == 'micro_bs': opts['micro_bs'] = 8
    if cell['step'] == 'act_ckpt': opts['activation_checkpointing'] = _layer(cell['learner'])
    if cell['strategy'] in ('fsdp', 'sharded') and world > 1:
        learn.accelerate(cpu_fsdp_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2), **kw), **opts)
    else: learn.accelerate(**kw, **opts)
    if kind in ('kill', 'resume'):
        # every 3 steps only: the newest checkpoint at the kill is mid-epoch (a language model's streams go on from it)
        cbs.append(CheckpointCallback(out/f'ckpt-{cell_id(cell)}', every_steps=3, every_epochs=None,
                                      resume=kind == 'resume'))
    if kind == 'kill': cbs.append(KillAt(KILL_AFTER, out/f'killed-{cell_id(cell)}-rank{rank()}'))
    return cbs

def rank(): return int(os.environ.get('RANK', 0))

def run_job(kind, cell, world, out):
    "Run one job in this (forked) process; write what it gave"
    res,prog = dict(kind=kind, cell=cell, world=world),Progress()
    t0 = time.time()
    try:
        stage = 'build'
        learn = make(cell, world)
        before = snapshot(learn)
        stage = 'accelerate'
        cbs = ask(learn, cell, world, kind, out)
        stage = 'fit'
        learn.fit_one_cycle(2, LRS[cell['learner']], cbs=cbs+[prog])
        # the losses and metrics: the columns monitors add (items/s, memory) differ from run to run
        names = list(learn.recorder.metric_names[1:-1])
        cols = [i for i,n in enumerate(names) if n in ('train_loss', 'valid_loss', *(m.name for m in learn.metrics))]
        res.update(params=[full(p) for p in learn.model.parameters()], names=[names[i] for i in cols],
                   values=[[float(row[i]) for i in cols] for row in learn.recorder.values])
        for cb in cbs: # (the fit's own callbacks: gone from `learn.cbs` after it)
            if isinstance(cb, NonFiniteGuardCallback): res['skipped'] = cb.skipped
            if isinstance(cb, CheckpointCallback): res['resumed_from'] = cb.resumed_from and cb.resumed_from.name
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        res.update(error=f'{type(e).__name__}: {e}', stage=stage, batches=prog.batches if stage == 'fit' else 0,
                   raised_in=tb[-1].filename if tb else '', trace=traceback.format_exc()[-4000:])
        res['unchanged'] = stage != 'build' and same(before, snapshot(learn))
    res['seconds'] = time.time() - t0
    torch.save(res, out/f'{kind}-{cell_id(cell)}-rank{rank()}.pt')

def fork_job(n, kind, cell, world, out, timeout=300):
    "Run a job in a child process; SIGKILL it after `timeout` seconds"
    log = out/f'{kind}-{cell_id(cell)}-rank{rank()}.log'
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
            os.dup2(fd, 1); os.dup2(fd, 2)
            if world > 1: # a process group of this job's own
                dist.init_process_group('gloo', init_method=f'file://{out}/pg-{n}', rank=rank(), world_size=world)
            run_job(kind, cell, world, out)
            code = 0
        except BaseException: traceback.print_exc()
        finally: os._exit(code)
    end = time.time() + timeout
    while True:
        done,status = os.waitpid(pid, os.WNOHANG)
        if done: return status
        if time.time() > end:
            os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
            (out/f'{kind}-{cell_id(cell)}-rank{rank()}.hung').touch()
            return None
        time.sleep(0.05)

if __name__ == '__main__':
    out,plan = Path(sys.argv[1]),sys.argv[2]
    world = int(os.environ.get('WORLD_SIZE', 1))
    jobs = json.loads((out/f'{plan}.json').read_text())
    for n,(kind,cell) in enumerate(jobs):
        fork_job(f'{plan}-{n}', kind, cell, world, out)
        # every rank done with job n before any starts job n+1: a job one rank left early (failed, or killed when it
        # hung) leaves the others no job behind
        (out/f'{plan}-{n}-done-rank{rank()}').touch()
        end = time.time() + 600
        while not all((out/f'{plan}-{n}-done-rank{r}').exists() for r in range(world)) and time.time() < end:
            time.sleep(0.05)
    (out/f'{plan}-done-rank{rank()}').touch()

"""Building a model larger than a process's memory budget, on 2 CPU processes under FSDP2: as usual, and in `sharded_init`.

Run: python bench/bench_sharded_init.py [--layers 64] [--hidden 1024] [--budget 0.75] [--json FILE]
Each way is one launch of 2 fresh processes (`torchrun`). Each process caps the memory it may add from there with
`RLIMIT_AS` (`budget` times the model's bytes), builds the learner, and lets `.accelerate(fsdp_plugin=...)` shard it
(`fit(0)`). The table gives, per process, whether that fitted, the peak resident memory it added while building and
sharding (`VmHWM`, reset before), and the parameter bytes it holds after. On CPU, Accelerate would train an FSDP request
as plain DDP: the FSDP2 path is forced with the library's test-only helper, as bench/bench_fsdp.py does."""
import argparse, json, os, re, resource, subprocess, sys, tempfile
from contextlib import nullcontext
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument('--layers', type=int, default=64, help='Linear layers of `hidden` x `hidden`')
p.add_argument('--hidden', type=int, default=1024)
p.add_argument('--budget', type=float, default=0.75, help="what each process may add, as a share of the model's bytes")
p.add_argument('--json', help='also write the results there')
p.add_argument('--worker', nargs=2, metavar=('WAY', 'OUT'), help=argparse.SUPPRESS) # one launched process
args = p.parse_args()

def status(key):
    "A field of /proc/self/status, in bytes"
    return int(re.search(rf'{key}:\s+(\d+) kB', Path('/proc/self/status').read_text()).group(1))*1024

def worker(way, out):
    import torch
    from torch import nn
    from fastai.basics import Learner, Datasets, MSELossFlat, set_seed
    from accelerate.utils import FullyShardedDataParallelPlugin
    from fastxtend_accel.core import AcceleratorCallback # (`Learner.accelerate`)
    from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
    from fastxtend_accel.fsdp_values import local_bytes
    from fastxtend_accel.sharded_init import sharded_init
    h = args.hidden
    set_seed(0)
    x,y = torch.randn(64, h),torch.randn(64, 1)
    dls = Datasets(range(64), [[x.__getitem__], [y.__getitem__]], splits=[range(32), range(32, 64)]).dataloaders(
        bs=16, device='cpu', num_workers=0)
    acc = cpu_fsdp_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2), mixed_precision='no')
    size = (args.layers*h*(h+1) + h+1)*4
    budget = int(args.budget*size)
    Path('/proc/self/clear_refs').write_text('5') # resets VmHWM to the resident memory now
    base = status('VmRSS')
    soft,hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (status('VmSize') + budget, hard))
    res = dict(way=way, rank=int(os.environ['RANK']), size=size, budget=budget)
    try:
        with sharded_init() if way == 'sharded' else nullcontext():
            model = nn.Sequential(*[nn.Linear(h, h) for _ in range(args.layers)], nn.Linear(h, 1))
            learn = Learner(dls, model, loss_func=MSELossFlat())
        learn.accelerate(acc)
        with learn.no_bar(), learn.no_logging(): learn.fit(0) # sharded at the start of a fit
        res.update(fits=True, held=local_bytes(learn.model)['params'])
    except (RuntimeError, MemoryError) as e:
        m = re.search(r"can't allocate memory: you tried to allocate \d+ bytes", str(e))
        res.update(fits=False, error=m.group(0) if m else str(e).splitlines()[-1].strip()[:100])
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    res['peak_added'] = status('VmHWM') - base
    Path(out, f"{way}{res['rank']}.json").write_text(json.dumps(res))

def launch(way, out):
    "The processes of one way, each writing its JSON into `out`"
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', __file__,
           '--layers', str(args.layers), '--hidden', str(args.hidden), '--budget', str(args.budget), '--worker', way, out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    return [json.loads(Path(out, f'{way}{r}.json').read_text()) for r in range(2)]

if args.worker: worker(*args.worker)
else:
    MiB = 2**20
    with tempfile.TemporaryDirectory() as d: rows = [r for way in ('full', 'sharded') for r in launch(way, d)]
    print(f"model: {rows[0]['size']/MiB:.0f} MiB of parameters; each process may add {rows[0]['budget']/MiB:.0f} MiB "
          f"({args.budget:.2f}x)\n")
    print('| way | process | fits | peak RSS added (MiB) | parameters held (MiB) |')
    print('|---|---|---|---|---|')
    for r in rows:
        held = f"{r['held']/MiB:.0f}" if r['fits'] else r['error']
        print(f"| {r['way']} | {r['rank']} | {'yes' if r['fits'] else 'no'} | {r['peak_added']/MiB:.0f} | {held} |")
    if args.json: Path(args.json).write_text(json.dumps(rows))

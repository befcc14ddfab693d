"""Gradient all-reduces per epoch against optimizer steps, and 2-process against 1-process throughput, on CPU.

    .venv/bin/python bench/bench_ddp.py          # launches itself with torchrun; about a minute

Each configuration trains a 784-1024-1024-10 MLP for one epoch of 64 global batches of 128 items, with and without
gradient accumulation; DDP's all-reduces are counted by a communication hook.
"""
import json, os, subprocess, sys, tempfile, time, warnings
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastxtend_accel.core import *

class SyncCounter(Callback):
    "Count optimizer steps, batches whose backward all-reduced gradients, and all-reduce calls (one per bucket); time training"
    order = AcceleratorCallback.order+1 # after the model is wrapped in DDP
    def before_fit(self):
        self.steps,self.allreduces,self.synced = 0,0,set()
        if isinstance(self.learn.model, nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            def hook(state, bucket):
                self.allreduces += 1
                self.synced.add(self.learn.iter)
                return allreduce_hook(state, bucket)
            self.learn.model.register_comm_hook(None, hook)
    def before_train(self): self.start = time.perf_counter()
    def after_train(self): self.elapsed = time.perf_counter() - self.start
    def after_step(self): self.steps += 1
    def before_validate(self): raise CancelValidException()

def worker(out):
    warnings.filterwarnings('ignore')
    world = int(os.environ.get('WORLD_SIZE', 1))
    n,bs = 64*128,128//world
    x,y = torch.randn(n, 784, generator=torch.Generator().manual_seed(0)),torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(1))
    res = {}
    for k in (1, 2, 4):
        dl = TorchDL(TensorDataset(x, y), batch_size=bs, shuffle=True, drop_last=True)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        learn = Learner(DataLoaders(dl, dl), model, loss_func=F.cross_entropy, cbs=SyncCounter()).accelerate(gradient_accumulation_steps=k)
        with learn.no_bar(), learn.no_logging():
            learn.fit(1, 1e-4) # warm up
            learn.fit(1, 1e-4)
        c = learn.sync_counter
        res[k] = dict(batches=n//128, steps=c.steps, synced=len(c.synced), allreduces=c.allreduces, samples_per_s=n/c.elapsed)
    if learn.is_main_process: Path(out).write_text(json.dumps(res))

def main():
    env = {**os.environ, 'PYTHONWARNINGS': 'ignore'}
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, __file__, '--worker', f'{d}/one.json'], check=True, env=env, capture_output=True)
        subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', __file__, '--worker', f'{d}/two.json'],
                       check=True, env=env, capture_output=True)
        one,two = [json.loads(Path(f'{d}/{f}.json').read_text()) for f in ('one', 'two')]
    print("| processes | accumulation k | batches/process | optimizer steps | batches that all-reduced | all-reduce calls (buckets) | samples/s |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for name,res in (('1', one), ('2', two)):
        for k,r in res.items():
            synced,calls = (r['synced'],r['allreduces']) if name == '2' else ('-','-')
            print(f"| {name} | {k} | {r['batches']} | {r['steps']} | {synced} | {calls} | {r['samples_per_s']:.0f} |")
            if name == '2': ok &= r['synced'] == r['steps']
    print(f"\nbatches that all-reduced == optimizer steps on 2 processes: {'yes' if ok else 'NO'}")
    print(f"2-process / 1-process throughput (k=1): {two['1']['samples_per_s']/one['1']['samples_per_s']:.2f}x "
          f"on {os.cpu_count()} cores (informational: the processes share the cores)")

if __name__ == '__main__':
    if '--worker' in sys.argv: worker(sys.argv[-1])
    else: main()

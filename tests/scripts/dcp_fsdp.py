"""The dcp_resume.py fit (digits, batches of 36 split among the processes, one-cycle, checkpoints every 3 steps) on a model sharded with
FSDP2 through `learn.accelerate(fsdp_plugin=...)` (forced onto CPU processes, tests only); hidden layer of 50: uneven shards on 3 processes.
Each process writes OUT/TAG-rankR.pt (its shards' sizes); the main process OUT/TAG-full.pt (full weights and optimizer state at the end)."""
import argparse, torch
from pathlib import Path
from torch.distributed.tensor import DTensor
from accelerate.utils import FullyShardedDataParallelPlugin
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
from fastxtend_accel.fsdp_values import gathered
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint
from fastxtend_accel.ema import EMACallback
from fastxtend_accel.test_utils import synth_learner_digits, StopAt

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('--tag', default='run')
p.add_argument('--stop', default=None, help='EPOCH,ITER: end the fit after this training batch')
p.add_argument('--ckpt', default=None, help="where the checkpoints go (OUT/ckpt if None): a folder, or a store's URL")
args = p.parse_args()
out = Path(args.out)

learn = synth_learner_digits(n=768, bs=36, hidden=50, cbs=EMACallback(decay=0.9))
learn.accelerate(cpu_fsdp_accelerator(split_batches=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)))
ckpt = args.ckpt or out/'ckpt'
resumed_from = latest_checkpoint(ckpt)
with learn.no_bar(), learn.no_logging():
    learn.fit_one_cycle(3, 1e-2, cbs=[CheckpointCallback(ckpt, every_steps=3, every_epochs=None, resume=True)] + ([StopAt(*map(int, args.stop.split(',')))] if args.stop else []))
rank = learn.accelerator.process_index
params = list(learn.model.parameters())
local = lambda t: t.to_local().shape[0] if isinstance(t, DTensor) else None
res = dict(dtensor=all(isinstance(p, DTensor) for p in params), local=[local(p) for p in params],
           opt_local=[local(learn.opt.state[p]['grad_avg']) for p in params], resumed_from=resumed_from and resumed_from.name,
           values=learn.recorder.values, ema_local=[local(t) for t in learn.ema.avg.values()])
ema = [t.full_tensor() for t in learn.ema.avg.values()] # gathered: on every process
with gathered(learn, with_opt=True): # every process enters; the main process gets the full tensors
    if learn.is_main_process:
        torch.save(dict(params=[p.detach().clone() for p in learn.model.parameters()], ema=ema,
                        opt=[{k: v.clone() for k,v in learn.opt.state[p].items() if isinstance(v, Tensor)} for p,*_ in learn.opt.all_params()]),
                   out/f'{args.tag}-full.pt')
torch.save(res, out/f'{args.tag}-rank{rank}.pt')

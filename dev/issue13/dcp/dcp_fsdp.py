"""`save_state`/`load_state` of a `fully_shard`ed (FSDP2) model and its fastai optimizer, whose states are DTensors.
`save OUT`: an epoch of Adam, then a checkpoint in OUT/ck and the whole tensors in OUT/saved.pt.
`load OUT`: the checkpoint loaded into this run's shards; each process writes OUT/loaded-rankR.pt."""
import sys, torch
from pathlib import Path
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from fastai.basics import *
from fastxtend_accel.core import *
import fastxtend_accel.checkpoint
from fastxtend_accel.test_utils import synth_learner_digits

mode,out = sys.argv[1],Path(sys.argv[2])
learn = synth_learner_digits(n=256, bs=32, hidden=50, opt_func=partial(Adam, wd=0.01)) # 50 rows: uneven shards on 3 processes
learn.accelerate() # the process group, ranks and barriers
for m in learn.model:
    if isinstance(m, nn.Linear): fully_shard(m)
fully_shard(learn.model)
learn.create_opt() # on the sharded parameters
rank = learn.accelerator.process_index
whole = lambda t: t.full_tensor() if isinstance(t, DTensor) else t
def state(): return dict(params=[whole(p.detach()) for p in learn.model.parameters()],
                         opt=[{k: whole(v) for k,v in learn.opt.state[p].items() if isinstance(v, Tensor)} for p,*_ in learn.opt.all_params()])

if mode == 'save':
    # a plain fastai fit of the sharded model (every process on all the data): Accelerate's DDP set aside, its Accelerator kept
    with learn.removed_cbs(learn.accelerator), learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
    learn.save_state(out/'ck')
    st = state()
    if rank == 0: torch.save(st, out/'saved.pt')
else:
    learn.load_state(out/'ck')
    st = state()
    local = [p.to_local().shape[0] for p in learn.model.parameters()]
    opt_local = [learn.opt.state[p]['grad_avg'].to_local().shape[0] for p,*_ in learn.opt.all_params()]
    torch.save(dict(st, local=local, opt_local=opt_local, dtensor=all(isinstance(p, DTensor) for p in learn.model.parameters())),
               out/f'loaded-rank{rank}.pt')

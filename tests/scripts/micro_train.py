"A 2-epoch one-cycle fit of `synth_wide_learner` in micro-batches, checkpointed every 2 steps, resumed from OUT/ckpt."
import argparse, time, torch
from contextlib import ExitStack
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import synth_wide_learner, memory_limit
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('--micro', default='auto', help="'auto', or a number of items")
p.add_argument('--limit', type=int, default=0, help="MiB this process may take beyond what it holds when training starts")
p.add_argument('--sleep', type=float, default=0., help='seconds to wait after each batch, to leave time for a kill')
args = p.parse_args()
out = Path(args.out)

class Short(Callback):
    "The address space capped from the training's start (the learner built and set up by then)"
    def __init__(self, stack): self.stack,self.on = stack,False
    def before_train(self):
        if args.limit and not self.on: self.stack.enter_context(memory_limit(args.limit*2**20)); self.on = True

class Sleep(Callback):
    def after_batch(self): time.sleep(args.sleep)

warm = synth_wide_learner(n=1024, opt_func=SGD) # a process's first fit allocates for good what later fits reuse
with warm.no_bar(), warm.no_logging(): warm.fit(1)
learn = synth_wide_learner(opt_func=SGD).accelerate(micro_bs=args.micro if args.micro == 'auto' else int(args.micro))
with ExitStack() as stack:
    learn.fit_one_cycle(2, 1e-2, cbs=[CheckpointCallback(out/'ckpt', every_steps=2, every_epochs=None, resume=True),
                                      Short(stack), Sleep()])
mb = learn.micro_batches
torch.save(dict(params=[p.detach() for p in learn.model.parameters()], values=learn.recorder.values,
                found=mb.found, tried=mb.tried), out/'final.pt')

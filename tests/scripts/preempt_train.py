"A 3-epoch one-cycle fit with dropout, shuffling and 2 loader workers that checkpoints only on SIGTERM/SIGINT and resumes from OUT/ckpt if it can; each rank writes how it ended."
import argparse, json, time, psutil, torch
from pathlib import Path
from fastai.basics import *
from fastai.callback.schedule import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint import CheckpointCallback
from fastxtend_accel.test_utils import synth_learner_digits, tiny_mlp

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('--ready', type=int, default=None, help='after this many training batches, write OUT/ready-rank{r} and slow down to 0.2 s a batch')
args = p.parse_args()
out = Path(args.out)

class Ready(Callback):
    "Tell the test when to send its signal, and note the batch after which this process first saw it"
    order,n,seen,workers = CheckpointCallback.order-1,0,None,[] # before `CheckpointCallback`, which stops the fit at that batch
    def after_batch(self):
        if not self.training or args.ready is None: return
        self.n += 1
        if self.n == args.ready: (out/f'ready-rank{self.learn.accelerator.process_index}').touch()
        if self.n >= args.ready: time.sleep(0.2)
        if self.seen is None and self.learn.checkpoint.signals.signalled: # the loader's workers, still alive
            self.seen,self.workers = [self.epoch, self.iter+1],[c.pid for c in psutil.Process().children()]

set_seed(0)
learn = synth_learner_digits(n=768, bs=16)
for dl in learn.dls.loaders: dl.fake_l.num_workers = 2 # fastai's default is the number of CPUs
learn.model = tiny_mlp(p=0.3)
learn.accelerate()
rank,ready = learn.accelerator.process_index,Ready()
def ended(**kw): (out/f'ended-rank{rank}.json').write_text(json.dumps(dict(seen=ready.seen, **kw)))
try:
    with learn.no_bar(): learn.fit_one_cycle(3, 1e-2, cbs=[CheckpointCallback(out/'ckpt', every_epochs=None, resume=True), ready])
except SystemExit as e:
    ended(code=e.code, workers=ready.workers)
    raise
except Exception as e:
    ended(code=f'{type(e).__name__}: {e}')
    raise
torch.save(dict(params=[p.detach() for p in learn.model.parameters()], values=learn.recorder.values), out/f'final-rank{rank}.pt')
ended(code=None)

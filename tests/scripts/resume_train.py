"A 3-epoch one-cycle fit with dropout and shuffling that checkpoints every 3 steps and resumes from OUT/ckpt if it can."
import argparse, time, torch
from pathlib import Path
from fastai.basics import *
from fastai.callback.all import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import *
from fastxtend_accel.checkpoint.checksums import ChecksumFS # the files of a checkpoint are written through it
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('--sleep', type=float, default=0., help='seconds to wait after each batch, to leave time for a kill')
p.add_argument('--mixed-precision', default='no')
p.add_argument('--accumulate', type=int, default=1)
p.add_argument('--fastai-accumulate', type=int, default=0, help="fastai's `GradientAccumulation(n_acc=...)`, items")
p.add_argument('--fsdp', action='store_true', help="FSDP2 (Accelerate's path, forced on CPU processes)")
p.add_argument('--every-steps', type=int, default=3, help='0: none')
p.add_argument('--every-epochs', type=int, default=0, help='0: none')
p.add_argument('--dropout', type=float, default=0.3, help='0: no dropout, so the same values on every device')
p.add_argument('--slow-save', action='store_true', help='wait 30 s inside the first checkpoint write after epoch 0')
p.add_argument('--activations', action='store_true', help='recompute the activations of each Linear and Dropout')
args = p.parse_args()
out = Path(args.out)

if args.slow_save:
    save = ChecksumFS.save
    def slow(self, obj, fn):
        if fn.name == 'state.pt' and '-e0001-' in str(fn.parent): time.sleep(30)
        save(self, obj, fn)
    ChecksumFS.save = slow

class Sleep(Callback):
    def after_batch(self): time.sleep(args.sleep)

set_seed(0)
learn = synth_learner_digits(n=768, bs=16)
learn.model = tiny_mlp(p=args.dropout)
checkpointed = (lambda m: isinstance(m, (nn.Linear, nn.Dropout))) if args.activations else None
acc_kwargs = dict(mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.accumulate)
if args.fsdp:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    acc_kwargs = dict(accelerator=cpu_fsdp_accelerator(fsdp_plugin=plugin, **acc_kwargs))
learn.accelerate(**acc_kwargs, activation_checkpointing=checkpointed)
ckpt = CheckpointCallback(out/'ckpt', every_steps=args.every_steps or None, every_epochs=args.every_epochs or None,
                          resume=True)
ga = [GradientAccumulation(n_acc=args.fastai_accumulate)] if args.fastai_accumulate else []
learn.fit_one_cycle(3, 1e-2, cbs=[ckpt, Sleep(), *ga])
torch.save(dict(params=[p.detach() for p in learn.model.parameters()], values=learn.recorder.values, losses=learn.recorder.losses,
                own_smooth=learn.recorder.smooth_loss.own), # on several processes, each process's own smoothing
           out/f'final-rank{learn.accelerator.process_index}.pt')

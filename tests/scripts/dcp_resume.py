"""A 3-epoch one-cycle fit on the digits (no dropout) with `split_batches=True`, so the global batches are the same on any number
of processes. Checkpoints every 3 steps into OUT/ckpt or --ckpt (through torch.distributed.checkpoint) and resumes from there; each process
writes OUT/TAG-rankR.pt. The weights are averaged (`EMACallback`, validated with the average). Per-node preparation under `local_main_first` writes OUT/prepared-TAG-nodeN."""
import argparse, os, signal, time, torch
from datetime import timedelta
from accelerate.utils import InitProcessGroupKwargs
from pathlib import Path
from fastai.basics import *
from fastai.callback.all import *
from fastxtend_accel.core import *
from fastxtend_accel.accelerator import local_main_first
from fastxtend_accel.checkpoint import CheckpointCallback
from fastxtend_accel.watchdog import WatchdogCallback
from fastxtend_accel.ema import EMACallback
from fastxtend_accel.test_utils import synth_learner_digits, StopAt

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('--tag', default='run', help='names the result files')
p.add_argument('--stop', default=None, help='EPOCH,ITER: end the fit after this training batch')
p.add_argument('--async-save', action='store_true', help='write checkpoints in the background')
p.add_argument('--slow-write', type=float, default=0, help='seconds each checkpoint write after epoch 0 waits before writing its tensors')
p.add_argument('--sleep', type=float, default=0, help='seconds to wait after each batch')
p.add_argument('--sleep-alone', type=float, default=None, help="seconds to wait after each batch instead, in a restarted torchrun attempt left with one process")
p.add_argument('--kill-at', default=None, help="EPOCH,ITER: torchrun's first attempt only: the --fail-ranks fail after this batch")
p.add_argument('--fail', default='kill', choices=['kill', 'raise', 'stop'], help="how they fail: SIGKILL, an exception, or SIGSTOP (frozen)")
p.add_argument('--fail-ranks', default=None, help="RANK,...: the processes that fail (all if None)")
p.add_argument('--kill-in-write', default=None, help="NAME: torchrun's first attempt only: the --fail-ranks SIGKILL themselves while writing checkpoint NAME's tensors")
p.add_argument('--watchdog', type=float, default=None, help="seconds without a batch ending after which a process ends itself (WatchdogCallback)")
p.add_argument('--pg-timeout', type=float, default=None, help="seconds a collective waits for its peers (the process group's timeout)")
p.add_argument('--late-start', type=float, default=0, help="seconds rank 1 of a restarted torchrun attempt waits before it starts")
p.add_argument('--ckpt', default=None, help="where the checkpoints go (OUT/ckpt if None): a folder, or a store's URL")
args = p.parse_args()
out = Path(args.out)

if args.slow_write or args.kill_in_write:
    from torch.distributed.checkpoint import FileSystemWriter
    write = FileSystemWriter.write_data
    def slow(self, plan, planner):
        if args.slow_write and '-e0000-' not in str(self.path): time.sleep(args.slow_write)
        if args.kill_in_write and args.kill_in_write in str(self.path) and attempt == 0 and failing:
            write(self, plan, planner) # this process's shard on disk, the checkpoint not whole
            os.kill(os.getpid(), signal.SIGKILL)
        return write(self, plan, planner)
    FileSystemWriter.write_data = slow

attempt = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0))
failing = args.fail_ranks is None or os.environ.get('RANK', '0') in args.fail_ranks.split(',')
if attempt and os.environ.get('RANK') == '1': time.sleep(args.late_start) # its peer meets the store first

# per-node preparation: each node's main process first, then that node's others
node = os.environ.get('GROUP_RANK', '0')
with local_main_first():
    marker = out/f'prepared-{args.tag}-node{node}'
    first = not marker.exists()
    if first: time.sleep(0.5); marker.write_text(os.environ.get('RANK', '0'))

class Marker(Callback):
    "Note each training batch done in OUT/progress-TAG, and wait `--sleep`; `--kill-at`"
    order = 99 # after the checkpoint
    def after_batch(self):
        if not self.training: return
        (out/f'progress-{args.tag}').write_text(f'{self.epoch} {self.iter}')
        alone = args.sleep_alone is not None and attempt and self.learn.accelerator.num_processes == 1
        time.sleep(args.sleep_alone if alone else args.sleep)
        if args.kill_at and attempt == 0 and failing and (self.epoch, self.iter) == tuple(map(int, args.kill_at.split(','))):
            if args.fail == 'raise': raise RuntimeError('this process failed')
            os.kill(os.getpid(), signal.SIGKILL if args.fail == 'kill' else signal.SIGSTOP)

learn = synth_learner_digits(n=768, bs=36, path=out, cbs=[CSVLogger(fname=f'history-{args.tag}.csv'), EMACallback(decay=0.9)])
timeout = [InitProcessGroupKwargs(timeout=timedelta(seconds=args.pg_timeout))] if args.pg_timeout else []
learn.accelerate(split_batches=True, kwargs_handlers=timeout)
acc = learn.accelerator
stop = [StopAt(*map(int, args.stop.split(',')))] if args.stop else [] # after `Marker`: same order, added after it
cb = CheckpointCallback(args.ckpt or out/'ckpt', every_steps=3, every_epochs=None, resume=True, async_save=args.async_save)
watch = [WatchdogCallback(args.watchdog)] if args.watchdog else []
learn.fit_one_cycle(3, 1e-2, cbs=[cb, Marker(), *stop, *watch])
learn.save(f'final-{args.tag}') # a single-file save: the global main process alone writes it
torch.save(dict(params=[p.detach() for p in learn.model.parameters()], values=learn.recorder.values, ema=list(learn.ema.avg.values()),
                resumed_from=cb.resumed_from and cb.resumed_from.name, world=acc.num_processes, rank=acc.process_index,
                local_rank=acc.local_process_index, env_rank=int(os.environ.get('RANK', 0)), env_local_rank=int(os.environ.get('LOCAL_RANK', 0)),
                node=int(node), is_main=learn.is_main_process, is_local_main=acc.is_local_main_process, prepared_first=first,
                launch=os.environ.get('LAUNCH'), attempt=attempt),
           out/f'{args.tag}-rank{acc.process_index}.pt')

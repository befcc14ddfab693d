"""A 2-epoch fit on the digits with the monitors, Accelerate's trackers (those named in --trackers, from the main process
only), checkpoints every 4 steps resumed from, and the profiler on every process; --stop ends it after a batch. At its end
the main process draws the Recorder's losses, the throughput and lr_find's plot into OUT. Each process writes
OUT/rank{R}.pt; the trackers, checkpoints and traces go to WORK, which the launches share."""
import argparse, torch
from pathlib import Path
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
from fastai.basics import *
from fastxtend_accel.all import *
from fastxtend_accel.test_utils import synth_learner_digits, StopAt

p = argparse.ArgumentParser()
p.add_argument('out')
p.add_argument('work')
p.add_argument('--trackers', default='tensorboard,mlflow', help='the `log_with` of `.accelerate`, comma-separated')
p.add_argument('--stop', default=None, help='EPOCH,ITER: end the fit after this training batch')
args = p.parse_args()
out,work = Path(args.out),Path(args.work)

learn = synth_learner_digits(n=320, bs=16, cbs=TrackersCallback('digits', every=1, config=dict(seed=42)))
learn.accelerate(log_with=args.trackers.split(','), project_dir=work/'tb').monitor(peak_flops=1e9)
stop = [StopAt(*map(int, args.stop.split(',')))] if args.stop else []
ckpt = CheckpointCallback(work/'ckpt', every_steps=4, every_epochs=None, resume=True)
prof = ProfilerCallback(work/'prof', wait=1, warmup=1, active=2, ranks=None)
with learn.no_bar(): learn.fit_one_cycle(2, 1e-2, cbs=[ckpt, prof, *stop])
res = dict(values=learn.recorder.values, names=list(learn.recorder.metric_names), losses=[float(o) for o in learn.recorder.losses],
           lrs=list(learn.recorder.lrs), throughput=learn.throughput.history, memory=learn.memory.history,
           steps=learn.trackers.steps, run_kwargs=learn.trackers.run_kwargs, traces=[str(t) for t in prof.traces],
           resumed=ckpt.resumed_from is not None, world=learn.accelerator.accelerator.num_processes)
if not args.stop:
    if learn.is_main_process:
        ax = learn.recorder.plot_loss(skip_start=0)
        res['plot_loss'] = [list(map(float, l.get_ydata())) for l in ax.lines]
        plt.savefig(out/'loss.png'); plt.close('all')
        ax = learn.throughput.plot()
        res['plot_throughput'] = list(map(float, ax[0].lines[0].get_ydata()))
        plt.savefig(out/'throughput.png'); plt.close('all')
    with learn.no_bar(), learn.no_logging(): learn.lr_find(end_lr=1, num_it=8, show_plot=False)
    res['lr_find'] = dict(lrs=list(learn.recorder.lrs), losses=[float(o) for o in learn.recorder.losses])
    if learn.is_main_process:
        learn.recorder.plot_lr_find()
        res['plot_lr_find'] = list(map(float, plt.gca().lines[0].get_xdata()))
        plt.savefig(out/'lr_find.png'); plt.close('all')
torch.save(res, out/f'rank{learn.accelerator.accelerator.process_index}.pt')

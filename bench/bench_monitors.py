"""What the monitors cost a training step: the same accelerated `Learner` with them off and on, timed side by side.

    .venv/bin/python bench/bench_monitors.py        # the tiny MLP (64-256-256-10, bs 64, 200 steps), about 30 s on 2 CPU cores

Variants, interleaved in every repeat, each one training epoch of the same model and data (bench_loop.py's pieces):
the `Learner` with `.accelerate()` and no monitor; with `ThroughputCallback` (four events a batch, or two with
`phases=False`); with `.monitor()` (throughput and memory);
and with `.monitor()` plus `TrackersCallback` sending to TensorBoard every 10 steps, if tensorboard is installed. Monitors
off, nothing is added to a batch: the callbacks are not there. On, each batch reads the clock a few times; the target is
a cost of at most 2% a step on this tiny model, where the step itself is shortest."""
import argparse, statistics, tempfile, warnings
import torch
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastxtend_accel.all import *
from bench_loop import mlp, learner, TrainTimer, interleave, table, ratio, verdict, use_clock

def monitored_loop(model, dl, cbs=(), **accelerate_kwargs):
    "A training epoch of an accelerated `Learner` with `cbs`, timed by `TrainTimer`"
    learn = learner(model, dl, cbs=[TrainTimer(), *cbs]).accelerate(**accelerate_kwargs)
    def run():
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        return learn.train_timer.elapsed
    return run

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--n-in', type=int, default=64)
    p.add_argument('--hidden', type=int, default=256)
    p.add_argument('--bs', type=int, default=64)
    p.add_argument('--steps', type=int, default=200, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=9)
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    torch.set_num_threads(1)
    use_clock('cpu') # this process's CPU time: steadier than the wall clock on a shared machine
    x,y = torch.randn(args.steps*args.bs, args.n_in),torch.randint(0, 10, (args.steps*args.bs,))
    dl = TorchDL(TensorDataset(x, y), batch_size=args.bs, drop_last=True)
    model = partial(mlp, args.n_in, args.hidden)
    runs = {'monitors off': monitored_loop(model(), dl),
            'ThroughputCallback': monitored_loop(model(), dl, [ThroughputCallback()]),
            'ThroughputCallback(phases=False)': monitored_loop(model(), dl, [ThroughputCallback(phases=False)]),
            'monitor() (throughput, memory)': monitored_loop(model(), dl, [ThroughputCallback(), MemoryCallback()])}
    tmp = tempfile.TemporaryDirectory()
    try:
        check_trackers('tensorboard')
        runs['monitor() + TensorBoard every 10 steps'] = monitored_loop(
            model(), dl, [ThroughputCallback(), MemoryCallback(), TrackersCallback('bench')], log_with='tensorboard',
            project_dir=tmp.name)
    except ImportError: print('(tensorboard not installed: `pip install tensorboard` to add the tracker row)')
    times = interleave(runs, args.repeats, per=args.steps)
    print(f"\nMLP {args.n_in}-{args.hidden}-{args.hidden}-10, bs {args.bs}, AdamW, {args.steps} steps x {args.repeats} "
          f"interleaved repeats, cpu, 1 thread, cpu clock, torch {torch.__version__}")
    print(table(times, 'monitors off', unit='us/step', scale=1e6))
    for k in list(runs)[1:]:
        cost = (ratio(times, k, 'monitors off') - 1)*statistics.median(times['monitors off'])*1e6
        print(f"cost per step: {k}: {cost:+.1f} us")
    print(verdict('monitor() / monitors off', ratio(times, 'monitor() (throughput, memory)', 'monitors off'), 1.02))
    tmp.cleanup()

if __name__ == '__main__': main()

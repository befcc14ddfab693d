"""What micro-batches save and cost: the same accelerated `Learner` with whole batches, with `micro_bs` a quarter of the
batch, and with `micro_bs='auto'` that never runs out (what keeping the state to back off with costs), side by side,
for a residual MLP and a small CNN.

    .venv/bin/python bench/bench_microbatch.py                # ~1 min on 2 CPU cores
    .venv/bin/python bench/bench_microbatch.py --device cuda  # `torch.cuda.max_memory_allocated`

Memory and time are measured as bench_activations.py measures them (its `StepPeak`: the most a training step takes
above what the process held when it started, from the third step on; the median training step, the variants
interleaved in every repeat)."""
import argparse, ctypes, statistics, warnings
import torch
from fastai.basics import *
from fastxtend_accel.core import *
from bench_loop import TrainTimer, interleave, use_clock
from bench_activations import StepPeak, data, mlp_blocks, small_cnn

def learner(model, dl, device, micro_bs, cbs):
    "An accelerated `Learner` (AdamW) on `dl`, in micro-batches of `micro_bs` if given"
    learn = Learner(DataLoaders(dl, dl), model, loss_func=CrossEntropyLossFlat(), lr=1e-4, cbs=cbs)
    return learn.accelerate(cpu=device == 'cpu', micro_bs=micro_bs)

def bench(name, make, kind, bs, args):
    dl = data(kind, bs*args.steps, bs)
    variants = {'whole batches': None, f'micro_bs={bs//4}': bs//4, "micro_bs='auto'": 'auto'}
    peaks,runs = {},{}
    for k,micro in variants.items():
        peak = StepPeak(args.device)
        learn = learner(make().to(args.device), dl, args.device, micro, [peak])
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        peaks[k] = statistics.median(peak.peaks)
        learn = learner(make().to(args.device), dl, args.device, micro, [TrainTimer()])
        def run(learn=learn):
            with learn.no_bar(), learn.no_logging(): learn.fit(1)
            return learn.train_timer.elapsed
        runs[k] = run
    times = interleave(runs, args.repeats, per=args.steps)
    med = {k: statistics.median(v) for k,v in times.items()}
    n = sum(p.numel() for p in make().parameters())
    print(f"\n{name} ({n:,} parameters), bs {bs}, {args.steps} steps x {args.repeats} interleaved repeats, {args.device}")
    print("| batches | step's peak memory (MiB, median) | ms/step (median) | min-max |\n|---|---|---|---|")
    for k in runs: print(f"| {k} | {peaks[k]/2**20:.1f} | {med[k]*1e3:.2f} | {min(times[k])*1e3:.2f}-{max(times[k])*1e3:.2f} |")
    whole,quarter,auto = variants
    print(f"quarters / whole: memory {peaks[quarter]/peaks[whole]:.2f}x, time {med[quarter]/med[whole]:.2f}x; "
          f"auto / whole: time {med[auto]/med[whole]:.2f}x")

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=10, help='batches per timed epoch')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--device', default='cpu')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    if args.device == 'cpu':
        ctypes.CDLL('libc.so.6').mallopt(-3, 64*1024) # M_MMAP_THRESHOLD: what is freed goes back, resident memory follows
        use_clock('cpu') # this process's CPU time: steadier than the wall clock on a shared machine
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench('Residual MLP, 8 blocks of 256', mlp_blocks, 'mlp', 256, args)
    bench('CNN, 5 ConvLayers of 32-64 channels', small_cnn, 'cnn', 64, args)

if __name__ == '__main__': main()

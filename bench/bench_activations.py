"""What activation checkpointing saves and costs: the same accelerated `Learner` without and with
`.accelerate(activation_checkpointing=True)`, side by side, for a residual MLP, a small CNN and AWD_LSTM.

    .venv/bin/python bench/bench_activations.py                # ~1 min on 2 CPU cores
    .venv/bin/python bench/bench_activations.py --device cuda  # `torch.cuda.max_memory_allocated`

Memory: the most a training step takes above what the process held when the step started, once the first steps have
allocated the gradients and the optimizer's state: what is left is the activations kept for the backward pass and the
step's temporaries. On CPU it is the process's resident memory high-water mark, reset before each step
(`/proc/self/clear_refs`), with glibc told to map every allocation of 64 KiB or more on its own and give it back when
freed (`mallopt`), so that resident memory follows the tensors alive; on CUDA, `torch.cuda.max_memory_allocated`.
Time: the median training step, both variants interleaved in every repeat (bench_loop.py's pieces)."""
import argparse, ctypes, statistics, warnings
import torch
from torch import nn
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from fastai.basics import *
from fastai.layers import ConvLayer
from fastai.text.models.core import get_language_model
from fastai.text.models.awdlstm import AWD_LSTM, awd_lstm_lm_config
from fastai.callback.rnn import ModelResetter, RNNCallback
from fastxtend_accel.core import *
from fastxtend_accel.activations import ActivationCheckpointing
from fastxtend_accel.test_utils import BlockNet
from bench_loop import TrainTimer, interleave, use_clock

def _rss(key):
    "This process's resident memory ('VmRSS:') or its high-water mark ('VmHWM:'), in bytes"
    for line in open('/proc/self/status'):
        if line.startswith(key): return int(line.split()[1])*1024

class StepPeak(Callback):
    "The most memory each training step takes above what was held when it started, from the third step on"
    order = 100 # the last before the forward pass
    def __init__(self, device): self.cuda,self.peaks = device.startswith('cuda'),[]
    def before_batch(self):
        if not self.training or self.iter < 2: return
        if self.cuda: torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); self.base = torch.cuda.memory_allocated()
        else:
            with open('/proc/self/clear_refs', 'w') as f: f.write('5') # the high-water mark, reset to what is held now
            self.base = _rss('VmRSS:')
    def after_batch(self):
        if not self.training or self.iter < 2: return
        if self.cuda: torch.cuda.synchronize(); self.peaks.append(torch.cuda.max_memory_allocated() - self.base)
        else: self.peaks.append(_rss('VmHWM:') - self.base)

def mlp_blocks():
    "8 residual blocks (`BlockNet`: `x + gelu(lin(norm(x)))`) of width 256, on 64 inputs"
    torch.manual_seed(0)
    return BlockNet(d=256, n=8)

def small_cnn():
    "fastai's `ConvLayer`s (conv, BatchNorm, ReLU), as `simple_cnn` builds them, on 3x32x32 images"
    torch.manual_seed(0)
    return nn.Sequential(ConvLayer(3, 32), ConvLayer(32, 32), ConvLayer(32, 64, stride=2), ConvLayer(64, 64),
                         ConvLayer(64, 64), nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(64, 10))

def awd_lstm():
    "fastai's AWD_LSTM language model: 3 LSTM layers of 256, embeddings of 128, 1,000 tokens, its default dropouts"
    torch.manual_seed(0)
    return get_language_model(AWD_LSTM, 1000, config={**awd_lstm_lm_config, 'emb_sz': 128, 'n_hid': 256})

def data(kind, n, bs):
    "A torch loader of `n` random items for model `kind`"
    g = torch.Generator().manual_seed(0)
    if kind == 'lm':
        toks = torch.randint(0, 1000, (n, 49), generator=g) # 48 tokens a row, each the next one's target
        ds = TensorDataset(toks[:, :-1], toks[:, 1:])
    else:
        x = torch.randn(n, 64, generator=g) if kind == 'mlp' else torch.randn(n, 3, 32, 32, generator=g)
        ds = TensorDataset(x, torch.randint(0, 10, (n,), generator=g))
    return TorchDL(ds, batch_size=bs, drop_last=True)

def learner(model, kind, dl, device, ac, cbs):
    "An accelerated `Learner` (AdamW) on `dl`, its activations checkpointed if `ac`"
    extra = [ModelResetter(), RNNCallback()] if kind == 'lm' else []
    learn = Learner(DataLoaders(dl, dl), model, loss_func=CrossEntropyLossFlat(), lr=1e-4, cbs=[*extra, *cbs])
    return learn.accelerate(cpu=device == 'cpu', activation_checkpointing=ac or None)

def bench(name, make, kind, bs, args):
    dl = data(kind, bs*args.steps, bs)
    peaks,runs,blocks = {},{},{}
    for ac in (False, True):
        k = 'checkpointed' if ac else 'kept'
        peak = StepPeak(args.device)
        learn = learner(make().to(args.device), kind, dl, args.device, ac, [peak])
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        peaks[k] = statistics.median(peak.peaks)
        cb = learn.cbs.filter(lambda c: isinstance(c, ActivationCheckpointing))
        if cb: blocks = Counter(type(b).__name__ for b in cb[0].blocks)
        learn = learner(make().to(args.device), kind, dl, args.device, ac, [TrainTimer()])
        def run(learn=learn):
            with learn.no_bar(), learn.no_logging(): learn.fit(1)
            return learn.train_timer.elapsed
        runs[k] = run
    times = interleave(runs, args.repeats, per=args.steps)
    n = sum(p.numel() for p in make().parameters())
    med = {k: statistics.median(v) for k,v in times.items()}
    print(f"\n{name} ({n:,} parameters), bs {bs}, {args.steps} steps x {args.repeats} interleaved repeats, {args.device}; "
          f"checkpointed: {', '.join(f'{v} {k}' for k,v in blocks.items())}")
    print("| activations | step's peak memory (MiB, median) | ms/step (median) | min-max |\n|---|---|---|---|")
    for k in runs: print(f"| {k} | {peaks[k]/2**20:.1f} | {med[k]*1e3:.2f} | {min(times[k])*1e3:.2f}-{max(times[k])*1e3:.2f} |")
    print(f"checkpointed / kept: memory {peaks['checkpointed']/peaks['kept']:.2f}x, "
          f"time {med['checkpointed']/med['kept']:.2f}x")

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
    bench('CNN, 5 ConvLayers of 32-64 channels', small_cnn, 'cnn', 32, args)
    bench('AWD_LSTM language model, 3 layers of 256', awd_lstm, 'lm', 16, args)

if __name__ == '__main__': main()

"""Train a small network on scikit-learn's digits with fastai, under Hugging Face Accelerate.

Run it as it is (one process), or on several:
    torchrun --nproc_per_node 2 examples/train.py
    accelerate launch --multi_gpu --num_processes 2 examples/train.py
"""
import argparse
from fastai.basics import *
from fastai.callback.all import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import digits_tensors

def digits_dls(bs):
    "fastai `DataLoaders` over the 1797 8x8 digit images, 20% held out"
    x,y = digits_tensors()
    x = x.view(-1, 1, 8, 8)
    splits = RandomSplitter(0.2, seed=42)(range_of(x))
    dsets = Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]], splits=splits)
    return dsets.dataloaders(bs=bs, num_workers=0, device='cpu')

def digits_cnn():
    "A small conv net for 8x8 images"
    return nn.Sequential(ConvLayer(1, 32), ConvLayer(32, 64, stride=2), ConvLayer(64, 128, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--epochs', type=int, default=5)
    p.add_argument('--bs', type=int, default=32, help='batch size on each process')
    p.add_argument('--lr', type=float, default=1e-2)
    p.add_argument('--mixed-precision', default='bf16', help="'no', 'bf16', 'fp16' (CUDA) or 'fp8'")
    p.add_argument('--accumulate', type=int, default=1, help='gradient accumulation steps')
    args = p.parse_args()
    set_seed(42)
    learn = Learner(digits_dls(args.bs), digits_cnn(), loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    learn.accelerate(mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.accumulate)
    acc = learn.accelerator
    acc.print(f'Training on {acc.num_processes} process(es), {acc.device}, mixed precision {acc.mixed_precision}')
    learn.fit_one_cycle(args.epochs, args.lr)
    preds,targs = learn.get_preds()
    acc.print(f'final validation accuracy: {(preds.argmax(1) == targs).float().mean().item():.4f}')

if __name__ == '__main__': main()

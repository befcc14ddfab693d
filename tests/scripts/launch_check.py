"A short fit under whatever launcher started this script; each rank saves its world size and weights."
import sys, torch
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import *

def main(out):
    learn = synth_learner_digits(n=256, bs=32).accelerate()
    learn.fit(1, 1e-2)
    acc = learn.accelerator
    torch.save(dict(world=acc.num_processes, rank=acc.process_index, backend=str(acc.state.backend),
                    params=[p.detach() for p in learn.model.parameters()]), Path(out)/f'rank{acc.process_index}.pt')

if __name__ == '__main__': main(sys.argv[1])

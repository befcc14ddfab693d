"Launched by `tests/test_compiler.py` with torchrun: train the digits learner compiled, in both orders of `.compile()` and `.accelerate()`, and uncompiled, and save what each rank ends with to OUTDIR"
import sys
from pathlib import Path
import torch
from fastxtend_accel.patching import compiled_graphs
from fastai.basics import *
from fastxtend_accel.test_utils import synth_learner_digits
from fastxtend_accel.compiler import *

def train(compile_first:bool|None, mixed_precision:str='bf16'):
    set_seed(0) # the DataLoader seeds its shuffling from the global RNG
    learn = synth_learner_digits(n=256, bs=32)
    kw = dict(backend='aot_eager')
    learn = (learn.accelerate(mixed_precision=mixed_precision) if compile_first is None else # eager
             learn.compile(**kw).accelerate(mixed_precision=mixed_precision) if compile_first
             else learn.accelerate(mixed_precision=mixed_precision).compile(**kw))
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
    return learn

def summary(learn):
    acc = learn.accelerator.accelerator
    return dict(weights=torch.cat([p.detach().flatten() for p in learn.model.parameters()]),
                compiled=is_compiled(learn.model), model_type=type(learn.model).__name__,
                graphs=compiled_graphs(), mixed_precision=acc.mixed_precision,
                num_processes=acc.num_processes, rank=acc.process_index)

if __name__ == '__main__':
    res = {name: summary(train(*args)) for name,args in
           dict(compile_first=(True,), accelerate_first=(False,), eager=(None,), fp32=(True, 'no')).items()}
    torch.save(res, Path(sys.argv[1])/f"rank{res['fp32']['rank']}.pt")

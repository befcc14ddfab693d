"""Load a weights file, an exported learner and a checkpoint written on XLA, in a process without torch_xla (run through
`tests/scripts/without_xla.py`); save what they hold to OUT/loaded.pt."""
import sys, torch
from pathlib import Path
from fastai.learner import load_learner
from fastxtend_accel.all import checkpoint_to_weights
from fastxtend_accel.test_utils import digits_tensors
weights,export,ckpt,out = map(Path, sys.argv[1:5])
# no `map_location`: a storage saved from `xla:0` would need torch_xla to load
sd = torch.load(weights, weights_only=False, map_location=None) # `learn.save`'s, with or without the optimizer
learn = load_learner(export)
preds = learn.model(digits_tensors(20)[0]).detach() # the exported model, on the CPU
w = torch.load(checkpoint_to_weights(ckpt, out/'ckpt.pth'), weights_only=False, map_location=None)
sd = sd.get('model', sd)
torch.save(dict(devices=sorted({t.device.type for t in [*sd.values(), *w['model'].values()]}), preds=preds,
                model=sd, ckpt_model=w['model']), out/'loaded.pt')

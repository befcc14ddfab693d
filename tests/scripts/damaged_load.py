"""Save a checkpoint on this launch's processes, then load it damaged in every way: each file with bytes flipped at several
places, cut short, missing; no folder, an empty one, a file, another model's checkpoint; and one written before checksums.
Each process writes OUT/rankR.pt: what each load raised, and whether its learner stayed exactly as it was."""
import argparse, shutil, warnings, torch
from functools import partial
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint.codec import read_state_file, write_state_file
from fastxtend_accel.checkpoint.state import *
from fastxtend_accel.test_utils import synth_learner_digits, flip_bytes

p = argparse.ArgumentParser()
p.add_argument('out')
out = Path(p.parse_args().out)

def trained(**kwargs):
    learn = synth_learner_digits(n=256, **kwargs).accelerate()
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
    return learn

learn = trained()
ck = learn.save_state(out/'ck')
trained(hidden=32).save_state(out/'other')
rank,main = learn.accelerator.process_index,learn.is_main_process

def snapshot():
    "Everything a load changes: weights, optimizer state, the `Recorder`'s history, the random state"
    opt = [v.clone() for st in learn.opt.state_dict()['state'] for v in st.values() if isinstance(v, Tensor)]
    return [p.detach().clone() for p in learn.model.parameters()], opt, list(learn.recorder.values), torch.get_rng_state()

def same(a, b): return all(torch.equal(x, y) if isinstance(x, Tensor) else same(x, y) if isinstance(x, list) else x == y
                           for x,y in zip(a, b, strict=True))

def cut(fn): fn.write_bytes(fn.read_bytes()[:fn.stat().st_size//2])
damages = {f'flip@{at}': partial(flip_bytes, at=at) for at in (0, 0.25, 0.5, 0.75, 1)} | dict(cut=cut, missing=Path.unlink)

def attempt(path):
    "What loading `path` raised (or 'ok'), and whether the learner is as it was"
    before = snapshot()
    try: res = learn.load_state(path) and 'ok'
    except Exception as e: res = (type(e).__name__, str(e))
    return res, same(before, snapshot())

results = {}
for name in sorted(p.name for p in ck.iterdir()):
    for kind,damage in damages.items():
        if main:
            kept = (ck/name).read_bytes()
            damage(ck/name)
        learn.barrier()
        results[name, kind] = attempt(ck)
        learn.barrier()
        if main: (ck/name).write_bytes(kept)
        learn.barrier()
if main:
    (out/'empty').mkdir()
    (out/'old').mkdir()
    for p in ck.iterdir(): shutil.copy(p, out/'old')
    (out/'old'/'manifest.json').unlink() # as written before checkpoints had checksums
    st = read_state_file(out/'old'/'state.pt')
    del st['manifest']
    write_state_file(st, out/'old'/'state.pt')
learn.barrier()
for case in ('nothing', 'empty', 'ck/state.pt', 'other'): results[case] = attempt(out/case)
results['whole'] = attempt(ck) # put back: loads
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter('always')
    results['old'] = attempt(out/'old')
torch.save(dict(results=results, old_warnings=[str(w.message) for w in ws if 'checksums' in str(w.message)]),
           out/f'rank{rank}.pt')

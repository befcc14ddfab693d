"""Every fastai application's learner (tabular, collab, text classifier, language model, images) in two scenarios:

- `app_scenarios.py OUT`: `.accelerate()` and fit on 1 process (`python`, batches of 32) or 2 (torchrun, 16 each: the same
  global batches); each rank saves its weights and history, and rank 0 alone then runs `get_preds`, `predict` and `test_dl`.
- `app_scenarios.py OUT --resume`: for each application in turn, an uninterrupted one-cycle fit with `CheckpointCallback`
  (the reference, OUT/ref-APP.pt), then the same fit resuming from OUT/final-ck-APP, which stops mid-epoch (at or one batch
  after a checkpoint) to be killed: it writes OUT/killed-APP and sleeps. Run again, it resumes that application, finishes it
  (OUT/final-APP.pt) and stops in the next one; the sixth run finishes them all. tests/test_apps.py runs `resume_apps` in
  processes forked from pytest, where everything is imported already, and kills them with SIGKILL.
"""
import argparse, os, time
from pathlib import Path
import torch
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint import CheckpointCallback
from fastxtend_accel.test_utils import app_learners, synth_tabular_df, synth_ratings

LRS = dict(tabular=1e-2, collab=5e-2, text=3e-2, lm=1e-2, images=1e-2)

def app_items(app):
    "What `test_dl` and `predict` get for `app`: rows of a DataFrame, or indices for a `DataBlock`'s getters"
    if app == 'tabular': return synth_tabular_df(40, seed=1)
    if app == 'collab': return synth_ratings(40, seed=0) # pairs the model knows
    return list(range(40))

def params(learn): return [p.detach().clone() for p in learn.model.parameters()]

def evaluate(learn, app):
    "What fastai's evaluation gives on `learn`: validation loss and metrics, validation predictions, predictions on a test set, one prediction"
    res = dict(valid=list(learn.validate()))
    if app == 'lm': return res # fastai's `get_preds` can't concatenate the predictions of a shorter last chunk
    res['preds'],res['targs'] = learn.get_preds()
    items = app_items(app)
    res['test_preds'] = learn.get_preds(dl=learn.dls.test_dl(items))[0]
    if app != 'collab': # fastai's `predict` takes no collab row (`test_dl` wants a DataFrame)
        res['predict'] = learn.predict(items.iloc[3] if app == 'tabular' else items[3])[-1]
    return res

def fit_apps(out:Path):
    "Train each application with `.accelerate()`; rank 0 alone evaluates after the fit"
    world = int(os.environ.get('WORLD_SIZE', 1))
    bs = 32//world # per process: the global batch is 32 either way
    res = {}
    for app,make in app_learners.items():
        learn = make(bs=bs).accelerate()
        with learn.no_bar(), learn.no_logging(): learn.fit(2, LRS[app])
        rank = learn.accelerator.process_index
        res[app] = dict(params=params(learn), values=learn.recorder.values, losses=[float(l) for l in learn.recorder.losses])
        if learn.is_main_process:
            with learn.no_bar(): res[app].update(evaluate(learn, app))
        learn.wait_for_everyone()
    torch.save(res, out/f'rank{rank}.pt')
    return res

class _StopForKill(Callback):
    "After batch `at[1]` of epoch `at[0]`, write `marker` and wait to be killed"
    order = CheckpointCallback.order+1 # after the checkpoint of this batch
    def __init__(self, marker, at=(1, 3)): self.marker,self.at = marker,at
    def after_batch(self):
        if self.training and (self.epoch, self.iter) == self.at and not self.marker.exists():
            self.marker.touch()
            time.sleep(600)

class _FirstBatch(Callback):
    "The (epoch, batch) of the first training batch this process runs"
    def before_fit(self): self.first = None
    def after_batch(self):
        if self.training and self.first is None: self.first = (self.epoch, self.iter)

RESUME_KW = dict(tabular=dict(p=0.2), collab={}, text=dict(p=0.2), lm=dict(p=0.1), images={}) # dropout where the model has it: random draws to restore

def resume_apps(out:Path):
    "Each application's reference fit, then its killed or resumed fit, until one stops for a kill"
    for app,make in app_learners.items():
        if (out/f'final-{app}.pt').exists(): continue
        for name in ('ref', 'final'):
            if name == 'ref' and (out/f'ref-{app}.pt').exists(): continue
            learn = make(**RESUME_KW[app])
            cbs = [CheckpointCallback(out/f'{name}-ck-{app}', every_steps=3, every_epochs=None, resume=name == 'final'), _FirstBatch()]
            if name == 'final': cbs.append(_StopForKill(out/f'killed-{app}'))
            with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(3, LRS[app], cbs=cbs)
            torch.save(dict(params=params(learn), values=learn.recorder.values, first=cbs[1].first), out/f'{name}-{app}.pt')

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('out', type=Path)
    p.add_argument('--resume', action='store_true')
    args = p.parse_args()
    (resume_apps if args.resume else fit_apps)(args.out)

"Evaluation scenarios on 1 or 2 processes (same weights, bs 64 per process); each rank saves what it computed."
import sys, torch
from pathlib import Path
from fastai.basics import *
from fastai.callback.all import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import *
from copy import deepcopy

out = Path(sys.argv[1])

def shared(learn, f, *args, **kwargs):
    "`f` run with the evaluation shared between the processes (outside a fit each would evaluate alone)"
    with learn.distributed_eval(): return f(*args, **kwargs)

def regression_learner(n_valid=203, **kwargs):
    "256 training items and `n_valid` validation items after them, noisy targets, batches of 64, `mae` and `rmse`"
    return synth_regression_learner(n=256+n_valid, n_train=256, n_valid=n_valid, noise=0.1,
                                     **{'bs': 64, 'metrics': [mae, rmse], **kwargs})

res = {}
# valid loss, an AvgMetric (mae) and an AccumMetric (rmse) on 203 items
learn = regression_learner().accelerate()
res['regression'] = [float(v) for v in shared(learn, learn.validate)]
preds,targs,losses = shared(learn, learn.get_preds, with_loss=True)
res['regression_preds'] = dict(preds=preds, targs=targs, losses=losses)

# 129 items: on 2 processes the last batch leaves process 1 without a real item
learn = regression_learner(n_valid=129).accelerate()
preds,targs,losses = shared(learn, learn.get_preds, with_loss=True)
res['odd_tail'] = dict(values=[float(v) for v in shared(learn, learn.validate)], preds=preds, losses=losses)

# the same with plain torch DataLoaders
from torch.utils.data import DataLoader as TorchDL
learn = regression_learner().accelerate()
tdls = DataLoaders(*[TorchDL(dl.dataset, batch_size=64, shuffle=i == 0, collate_fn=lambda b: tuple(torch.stack(o) for o in zip(*b)))
                     for i,dl in enumerate(learn.dls.loaders)])
learn.dls = tdls
res['regression_torch_dl'] = [float(v) for v in shared(learn, learn.validate)]

# accuracy, and get_preds with inputs, losses and decoded outputs, on 203 digits
learn = synth_learner_digits(n=1015, bs=64).accelerate()
res['classification'] = [float(v) for v in shared(learn, learn.validate)]
inp,preds,targs,dec,losses = shared(learn, learn.get_preds, with_input=True, with_loss=True, with_decoded=True, act=partial(F.softmax, dim=-1))
res['classification_preds'] = dict(inp=inp, preds=preds, targs=targs, dec=dec, losses=losses)

# lr_find: same suggestion everywhere, weights and optimizer state as before
learn = synth_learner_digits(n=512, bs=32).accelerate()
learn.fit(1, 1e-3)
before = [p.detach().clone() for p in learn.model.parameters()]
opt_before = deepcopy(learn.opt.state_dict()['state'])
sugg = learn.lr_find(show_plot=False)
res['lr_find'] = dict(valley=sugg.valley, restored=all(torch.equal(a, b) for a,b in zip(before, learn.model.parameters())),
                      opt_restored=all(torch.equal(a['grad_avg'], b['grad_avg']) for a,b in zip(opt_before, learn.opt.state_dict()['state'])),
                      n_losses=len(learn.recorder.losses))

# early stopping that triggers (no learning: lr 0), with ReduceLROnPlateau beside it
learn = regression_learner().accelerate()
learn.fit(6, 0., cbs=[EarlyStoppingCallback(patience=2), ReduceLROnPlateau(patience=1)])
res['early_stop'] = dict(epochs=len(learn.recorder.values), lr=learn.opt.hypers[-1]['lr'])

# activation statistics over the global batch (32 items: 16 per process on 2)
world = learn.accelerator.num_processes
learn = regression_learner(bs=32//world, cbs=ActivationStats(modules=None, with_hist=True))
learn.dls.train.shuffle = False
learn.accelerate()
learn.fit(1, 1e-4)
res['act_stats'] = [[{k: v for k,v in d.items()} for d in batch] for batch in learn.activation_stats.stats]

rank = learn.accelerator.process_index
torch.save(res, out/f'rank{rank}.pt')

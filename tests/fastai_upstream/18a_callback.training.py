# %% prelude: what fastai/fastai nbs/18a_callback.training.ipynb (commit 015931b8) imports, and the module it documents
from fastai.basics import *
from fastai.callback.progress import *
from fastai.callback.fp16 import *
import fastai.callback.training as _m
globals().update({k:v for k,v in vars(_m).items() if not k.startswith('__')})
from nbdev.showdoc import *
from fastai.test_utils import *
# %%
learn = synth_learner()
learn.fit(1, cbs=ShortEpochCallback())
# %%
learn = synth_learner()
learn.fit(1, cbs=ShortEpochCallback(short_valid=False))
# %%
#|hide
class GetGrads(Callback):
    run_valid,order = False,GradientAccumulation.order+1
    def before_step(self): self.grads=to_detach(L([p.grad.clone() for p in self.model.parameters()]))

def _test_acc(bs,n,cbs=None,cuda=False):
    with no_random(99): 
        db=synth_dbunch(bs=bs,n_train=n,n_valid=n,cuda=cuda)
        learn = synth_learner(data=db,cbs=[GetGrads]+L(cbs))
        learn.fit(1, lr=0.01)
        train,valid = learn.recorder.values[-1]
        return train,valid,learn.get_grads.grads

acc_cb = GradientAccumulation(n_acc=8)

train1,valid1,grads1 = _test_acc(8,1)
train2,valid2,grads2 = _test_acc(1,8,acc_cb)

#grads should be same, valid loss same, train loss different
test_close(grads2,grads1)
test_close(valid2, valid1)
test_ne(train2, train1)
# %%
learn = synth_learner()
learn.fit(1, lr=0.01, cbs=GradientAccumulation(n_acc=1000))
# ensure valid_loss didn't change
assert learn.recorder.values[-1][1] == learn.recorder.values[0][1]
# %%
fp16 = MixedPrecision()
# %%
set_seed(99)
learn = synth_learner(lr=1.1, cuda=True)
learn.fit(3, cbs=fp16)
# %%
set_seed(99)
learn = synth_learner(lr=1.1, cuda=True)
learn.fit(3, cbs=[GradientClip,fp16])

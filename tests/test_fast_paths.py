"The per-step shortcuts (whole-batch fetch, lean items, event lists, fused `one_batch`) give fastai's batches and fits"
import cProfile, pstats, sys
from contextlib import nullcontext
from functools import partial
import pytest, torch
from torch.optim import AdamW
from torch.utils.data import TensorDataset, DataLoader as TorchDL
from torch import nn
from fastai.basics import (Callback, CategoryBlock, DataBlock, DataLoader, DataLoaders, Datasets, IndexSplitter,
                           Learner, OptimWrapper, RandomSplitter, TfmdDL, TransformBlock, range_of, set_seed)
from fastxtend_accel.test_utils import (digits_tensors, synth_learner_digits, datablock_learner, synth_lm_learner,
                                        run_cmd)
from fastxtend_accel.data import ShardedDL
from fastxtend_accel.fetching import batch_fetcher, fetching
from fastxtend_accel.items import item_maker, column_batches
import fastxtend_accel.core # `.accelerate()`

def _digits_dls(kind, bs=32, **kw):
    "Loaders of 300 digits: a `Datasets` of tensor getters (as `synth_learner_digits`), `TensorDataset`s, a `DataBlock`"
    x,y = digits_tensors(300)
    splits = RandomSplitter(0.2, seed=0)(range_of(x))
    set_seed(1) # the loaders' shuffling
    if kind == 'datablock':
        labels = y.tolist()
        dblock = DataBlock(blocks=(TransformBlock, CategoryBlock), get_x=lambda i: x[i], get_y=lambda i: labels[i],
                           splitter=lambda items: splits)
        return dblock.dataloaders(range_of(x), bs=bs, **kw)
    if kind == 'datasets':
        return Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]], splits=splits).dataloaders(bs=bs, **kw)
    return DataLoaders.from_dsets(*(TensorDataset(x[s], y[s]) for s in splits), bs=bs, **kw)

def _epochs(dl, n=3, fetched=False):
    "`n` epochs of `dl` (`fetched`: as an accelerated fit makes them), each tensor's type, dtype, shape, strides and bytes"
    with fetching(dl) if fetched else nullcontext():
        return [tuple((type(t), t.dtype, t.shape, t.stride(), t.numpy().tobytes()) for t in b)
                for _ in range(n) for b in dl]

@pytest.mark.parametrize('kind', ['datasets', 'tensords', 'datablock'])
@pytest.mark.parametrize('kw', [dict(drop_last=True), dict(drop_last=False), dict(num_workers=2, drop_last=True)],
                         ids=['drop_last', 'ragged', 'workers'])
def test_same_batches_as_item_by_item(kind, kw):
    "Shuffled epochs, with and without `drop_last`, in worker processes: the same batches as fastai's per-item path"
    fast,slow = _digits_dls(kind, **kw),_digits_dls(kind, **kw)
    for a,b in zip(fast.loaders, slow.loaders): # training (shuffled), validation
        assert (batch_fetcher(a) is None) == (kind == 'datablock') and (item_maker(a) is None) == (kind == 'tensords')
        assert (column_batches(a) is None) == (kind == 'tensords') # the `DataBlock`'s batches made in one pass each
        batches = _epochs(a, fetched=True)
        assert batches == _epochs(b) # fastai's own, item by item
    n = 7 if kw['drop_last'] else 8 # 240 items at bs 32
    assert len(_epochs(fast.train, 1, fetched=True)) == n == len(_epochs(slow.train, 1))
    with fetching(fast.train): assert torch.equal(fast.one_batch()[0], slow.one_batch()[0])

@pytest.mark.parametrize('split_batches', [False, True])
def test_same_shards_as_item_by_item(split_batches):
    "Both processes' shards of shuffled epochs (`ShardedDL`, as on 2 processes): fastai's per-item batches"
    for rank in (0, 1):
        fast,slow = (ShardedDL(_digits_dls('datasets').train, rank=rank, world_size=2, split_batches=split_batches)
                     for _ in range(2))
        assert _epochs(fast, fetched=True) == _epochs(slow)

def test_ineligible_loaders_fall_back():
    "An item transform, a `DataBlock`, a custom `create_item`, a dataset subclass: fastai's per-item path"
    x,y = digits_tensors(64)
    dsets = Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]])
    class MyTensorDataset(TensorDataset): pass
    loaders = [TfmdDL(dsets, bs=16, after_item=lambda o: o), TfmdDL(dsets, bs=16, create_item=lambda i: dsets[i]),
               datablock_learner(n=64).dls.train, TfmdDL(MyTensorDataset(x, y), bs=16), synth_lm_learner().dls.train]
    assert [batch_fetcher(dl) for dl in loaders] == [None]*len(loaders)
    assert batch_fetcher(TfmdDL(dsets, bs=16)) is not None
    # items with fewer calls for a `Datasets` and its item transform, a `DataBlock`; fastai's for the others
    assert [item_maker(dl) is None for dl in loaders] == [False, True, False, True, True]
    # batches in one pass: the `DataBlock` alone (the others: an item transform, their own items, no `Datasets`)
    assert [column_batches(dl) is None for dl in loaders] == [True, True, False, True, True]

# a fit with a fastai optimizer and a torch one, metrics, a schedule, clipping and a cancelled step; what is compared
_FIT = """
import sys, torch
from functools import partial
from fastai.basics import *
from fastai.callback.all import *
from torch.optim import AdamW
from torch.utils.data import TensorDataset, DataLoader as TorchDL
from fastxtend_accel.test_utils import synth_learner_digits, datablock_learner, digits_tensors, tiny_mlp
mode,data = sys.argv[1],sys.argv[3]
if mode != 'stock':
    from fastxtend_accel.core import *
    from fastxtend_accel.fetching import batch_fetcher, torch_fetcher
    from fastxtend_accel.items import item_maker, column_batches
class OwnDL(TorchDL): pass # iterated by torch
def torch_learner(n, bs, **kw):
    "torch loaders over `TensorDataset`s (in slow mode a subclass, which torch iterates), a model with dropout"
    x,y = digits_tensors(n)
    set_seed(0)
    cls = OwnDL if mode == 'slow' else TorchDL
    dls = DataLoaders(cls(TensorDataset(x[:400], y[:400]), batch_size=bs, shuffle=True, drop_last=True),
                      cls(TensorDataset(x[400:], y[400:]), batch_size=bs))
    return Learner(dls, tiny_mlp(64, 64, 10, 0.1), loss_func=nn.CrossEntropyLoss(), metrics=accuracy, **kw)
class SkipStep(Callback):
    def before_step(self):
        if self.learn.train_iter == 3: raise CancelStepException()
class SlowLoop(Learner): # a subclass replacing a part of the loop: fastai's `one_batch`
    def _do_one_batch(self): super()._do_one_batch()
res = {}
for opt in ('fastai', 'torch'):
    kw = {} if opt == 'fastai' else dict(opt_func=partial(OptimWrapper, opt=AdamW))
    make = dict(datasets=synth_learner_digits, datablock=datablock_learner, torchdl=torch_learner)[data]
    learn = make(n=512, bs=32, **kw)
    # fastai's items (own `create_item`, an item transform changing nothing), fastai's `one_batch`
    if mode == 'slow' and data != 'torchdl':
        dls = DataLoaders(*[dl.new(after_item=lambda o: o, create_item=dl.dataset.__getitem__)
                            for dl in learn.dls.loaders], device='cpu')
        for new,old in zip(dls.loaders, learn.dls.loaders): new.rng = old.rng # the same shuffles
        learn = SlowLoop(dls, learn.model, loss_func=learn.loss_func, metrics=accuracy, **kw)
    if mode != 'stock' and data == 'torchdl':
        learn.accelerate()
        assert [torch_fetcher(dl) is None for dl in learn.dls.loaders] == [mode == 'slow']*2
    elif mode != 'stock':
        learn.accelerate()
        assert (batch_fetcher(learn.dls.train) is None) == (mode == 'slow' or data == 'datablock')
        assert (item_maker(learn.dls.train) is None) == (column_batches(learn.dls.train) is None) == (mode == 'slow')
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(2, 1e-2, cbs=[GradientClip(0.5), SkipStep()])
    r = learn.recorder
    opt_state = learn.opt.opt.state if opt == 'torch' else learn.opt.state
    res[opt] = dict(values=r.values, losses=[l.item() for l in r.losses], lrs=r.lrs, iters=learn.train_iter,
                    weights=[p.detach().clone() for p in learn.model.parameters()],
                    opt_state=[{k: v.clone() if torch.is_tensor(v) else v for k,v in s.items()}
                               for s in opt_state.values()],
                    preds=learn.get_preds(dl=learn.dls.valid if data == 'torchdl' else None)[0])
torch.save(res, sys.argv[2])
"""

def _same(a, b):
    if isinstance(a, torch.Tensor): return torch.equal(a, b)
    if isinstance(a, dict): return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return len(a) == len(b) and all(_same(x, y) for x,y in zip(a, b))
    return a == b

@pytest.mark.parametrize('data', ['datasets', 'datablock', 'torchdl'])
def test_fit_bit_identical(tmp_path, data):
    "An accelerated fit on one process, with the shortcuts and without them, and stock fastai's: the same bits"
    res = {}
    for mode in ('stock', 'fast', 'slow'):
        run_cmd([sys.executable, '-c', _FIT, mode, tmp_path/f'{mode}.pt', data])
        res[mode] = torch.load(tmp_path/f'{mode}.pt', weights_only=False)
    for opt in ('fastai', 'torch'):
        assert len(res['stock'][opt]['losses']) == 24 and res['stock'][opt]['iters'] == 24
        for k in res['stock'][opt]:
            assert _same(res['fast'][opt][k], res['stock'][opt][k]), (opt, k)
            assert _same(res['slow'][opt][k], res['stock'][opt][k]), (opt, k)

_BATCHES = """
import sys, torch
from fastai.basics import *
from contextlib import nullcontext
from fastxtend_accel.test_utils import app_learners, datablock_learner
if sys.argv[1] == 'lib': from fastxtend_accel.fetching import fetching # as an accelerated learner's fit iterates them
def tensors(b): # a batch's tensors, those of its tuples included
    return [t for t in b if isinstance(t, torch.Tensor)] + [u for o in b if isinstance(o, tuple) for u in tensors(o)]
res = {}
for app,make in dict(app_learners, digits=datablock_learner).items():
    dls = make().dls
    res[app] = []
    for dl in dls.loaders:
        with fetching(dl) if sys.argv[1] == 'lib' else nullcontext():
            res[app] += [[(type(t).__name__, t.dtype, tuple(t.shape), t.stride(), t.numpy().tobytes()) for t in tensors(b)]
                         for _ in range(2) for b in dl]
torch.save(res, sys.argv[2])
"""

def test_app_batches_are_stock_fastai(tmp_path):
    "Two epochs of each application's loaders (text, images, tabular, collab, a `DataBlock`) in `fetching`: stock fastai's bits"
    for mode in ('stock', 'lib'): run_cmd([sys.executable, '-c', _BATCHES, mode, tmp_path/f'{mode}.pt'])
    stock,lib = (torch.load(tmp_path/f'{m}.pt', weights_only=False) for m in ('stock', 'lib'))
    assert stock.keys() == lib.keys() and len(stock) == 6
    for app in stock:
        assert len(stock[app]) > 4 and all(len(b) >= 2 for b in stock[app]) and lib[app] == stock[app], app

class _Profile(Callback):
    "Counts the Python calls of training steps `start` to `start+n` (cProfile)"
    order = 100
    def __init__(self, start=5, n=20): self.start,self.n,self.prof = start,n,cProfile.Profile()
    def after_batch(self):
        if not self.learn.training: return
        if self.learn.iter == self.start: self.prof.enable()
        elif self.learn.iter == self.start + self.n: self.prof.disable()
    @property
    def per_step(self): return pstats.Stats(self.prof).total_calls/self.n

def _calls_per_step(dls):
    learn = Learner(dls, synth_learner_digits(n=64).model, loss_func=nn.CrossEntropyLoss(),
                    opt_func=partial(OptimWrapper, opt=AdamW)).accelerate()
    prof = _Profile()
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-3, cbs=prof)
    return prof.per_step

def test_calls_per_step():
    "Python calls of an accelerated training step (bs 32, an MLP, AdamW): deterministic, measured with some margin"
    x,y = digits_tensors()
    tds = TensorDataset(x, y)
    dsets = Datasets(range_of(x), [[x.__getitem__], [y.__getitem__]], splits=[range(1500), range(1500, 1797)])
    set_seed(0)
    # 471 and 462 measured (3,410 and 1,221 before the shortcuts; 494 and 487 before `sample` gave its list's iterator)
    assert _calls_per_step(dsets.dataloaders(bs=32, num_workers=0)) < 560
    assert _calls_per_step(DataLoaders.from_dsets(tds, tds, bs=32, num_workers=0)) < 560
    # each batch fetched whole (`torch_fetcher`): 447 measured (692 item by item as torch makes it, 828 before the rest)
    assert _calls_per_step(DataLoaders(TorchDL(tds, batch_size=32, shuffle=True), TorchDL(tds, batch_size=32))) < 520
    # a `DataBlock`, items made with few calls, each label's tensor once, batches collated a column at a time, its
    # `TensorCategory` batches kept as they are on their device, the getters called with no lookup and an item made in one
    # call, then each batch made in one pass (`column_batches`): 598 measured (854 item by item, 918 before those two, 949
    # with fastai's `sample`, 1,366 before the labels' values were read in C, `retain` done without `L` and `to_device`
    # let them be; 1,648 with fastai's `do_batch`, 6,544 with fastai's items)
    labels = y.tolist()
    dblock = DataBlock(blocks=(TransformBlock, CategoryBlock), get_x=lambda i: x[i], get_y=lambda i: labels[i],
                       splitter=IndexSplitter(range(1500, 1797)))
    assert _calls_per_step(dblock.dataloaders(range_of(x), bs=32, num_workers=0)) < 680

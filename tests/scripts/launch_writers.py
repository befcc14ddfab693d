"A short fit with `CSVLogger` and `SaveModelCallback`, then `save` and `export`, under whatever launcher started this script: each rank notes the files it wrote."
import json, sys, torch
from pathlib import Path
from fastai.basics import *
from fastai.callback.progress import CSVLogger
from fastai.callback.tracker import SaveModelCallback
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import synth_learner_digits

def main(out):
    out,written = Path(out),[]
    def opened(event, args): # Python's `open`, as `CSVLogger` uses it
        if event == 'open' and str(args[0]).startswith(str(out)) and set(str(args[1] or 'r')) & set('wax+'): written.append(str(args[0]))
    sys.addaudithook(opened)
    torch_save = torch.save # which writes its files from C++, unseen by the audit hook
    def saving(obj, f, *args, **kwargs):
        if isinstance(f, (str, Path)): written.append(str(f))
        return torch_save(obj, f, *args, **kwargs)
    torch.save = saving
    learn = synth_learner_digits(n=256, bs=32, path=out).accelerate()
    with learn.no_bar(): learn.fit(2, 1e-2, cbs=[CSVLogger(), SaveModelCallback(fname='best')])
    saved = learn.save('final')
    learn.export()
    torch.save = torch_save
    acc = learn.accelerator
    (out/f'rank{acc.process_index}.json').write_text(json.dumps(dict(
        written=[str(Path(f).relative_to(out)) for f in written], saved=str(saved), env_rank=rank_distrib(), world=acc.num_processes)))

if __name__ == '__main__': main(sys.argv[1])

"fastai's own tests of its data, learner, metrics and callbacks (tests/fastai_upstream/) pass with the library too."
import json, sys
from pathlib import Path
from fastxtend_accel.test_utils import start_cmd

UPSTREAM = Path(__file__).parent/'fastai_upstream'
NOTEBOOKS = sorted(UPSTREAM.glob('[0-9]*.py'))
# cells passing on stock fastai here (of 20, 59, 10, 9, 66, 36, 16, 7): the comparison means something only if they run
MIN_PASSING = {'02_data.load': 16, '03_data.core': 58, '06_data.block': 7, '13_callback.core': 9, '13a_learner': 66,
               '13b_metrics': 33, '17_callback.tracker': 16, '18a_callback.training': 7}

def _results(procs):
    res = []
    for p in procs:
        out = p.communicate(timeout=300)[0].decode()
        assert p.returncode == 0, out[-3000:]
        res.append(json.loads(out.strip().splitlines()[-1]))
    return res

def test_fastai_notebooks_pass_with_the_library(tmp_path):
    "Every cell of fastai's notebooks that passes on stock fastai passes after `import fastxtend_accel.all`"
    assert [p.stem for p in NOTEBOOKS] == list(MIN_PASSING)
    procs = [] # both at once, each in a folder of its own (the cells save models and files)
    for flag in ([], ['--lib']):
        d = tmp_path/('lib' if flag else 'stock')
        d.mkdir()
        procs.append(start_cmd([sys.executable, UPSTREAM/'run_notebooks.py', *flag, *NOTEBOOKS], cwd=d))
    stock,lib = _results(procs)
    assert stock['fit_module'] == 'fastai.learner' and lib['fit_module'] == 'fastai.learner' # stock both: a plain learner runs fastai's code
    for nb,min_passing in MIN_PASSING.items():
        passing = [i for i,err in enumerate(stock['cells'][nb]) if err is None]
        assert len(passing) >= min_passing, f"{nb}: {len(passing)} cells pass on stock fastai: {stock['cells'][nb]}"
        broken = {i: lib['cells'][nb][i] for i in passing if lib['cells'][nb][i] is not None}
        assert not broken, f'{nb}: cells that pass on stock fastai fail with the library: {broken}'

"""The package as users install it: a wheel built from this tree holds every module and the command-line tools, and
installs and imports in a fresh venv (its dependencies from the tree's venv, through a `.pth`: nothing downloaded)."""
import os, re, shutil, subprocess, sys, sysconfig, zipfile
from pathlib import Path
import pytest
import fastxtend_accel

ROOT = Path(__file__).parents[1]

@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    "A wheel built from a copy of the tree's sources (a build leaves `build/` behind: not in the tree)"
    d = tmp_path_factory.mktemp('wheel')
    src = d/'src'
    shutil.copytree(ROOT/'fastxtend_accel', src/'fastxtend_accel', ignore=shutil.ignore_patterns('__pycache__'))
    for f in ('pyproject.toml', 'README.md', 'LICENSE'):
        if (ROOT/f).exists(): shutil.copy(ROOT/f, src/f)
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q', '-w', d/'dist', src],
                   check=True, capture_output=True)
    return next((d/'dist').glob('*.whl'))

def test_wheel_holds_every_module_and_the_tools(wheel):
    assert wheel.name == f'fastxtend_accel-{fastxtend_accel.__version__}-py3-none-any.whl'
    z = zipfile.ZipFile(wheel)
    missing = [n for p in (ROOT/'fastxtend_accel').rglob('*.py')
               if (n := p.relative_to(ROOT).as_posix()) not in z.namelist()]
    assert missing == []
    entry = z.read(next(n for n in z.namelist() if n.endswith('.dist-info/entry_points.txt'))).decode()
    assert 'fastxtend-verify-checkpoint = fastxtend_accel.checkpoint.checksums:verify_checkpoint_cmd' in entry
    assert 'fastxtend-requeue = fastxtend_accel.requeue:requeue_cmd' in entry

def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path/'venv'
    subprocess.run([Path(sys.base_prefix)/'bin'/'python3', '-m', 'venv', venv], check=True)
    subprocess.run([venv/'bin'/'pip', 'install', '--no-deps', '--no-index', '-q', wheel], check=True)
    site = Path(subprocess.run([venv/'bin'/'python', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (torch, fastai, accelerate) from the tree's venv, after the venv's own packages: its editable
    # install of this tree is not seen (a path a `.pth` adds has its own `.pth` files skipped)
    (site/'deps.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    env = {k: v for k,v in os.environ.items() if k != 'PYTHONPATH'}
    res = subprocess.run([venv/'bin'/'python', '-c', 'import fastxtend_accel, fastxtend_accel.all; '
                          'print(fastxtend_accel.__file__, fastxtend_accel.__version__)'],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    path,version = res.stdout.split()
    assert Path(path).is_relative_to(site) and version == fastxtend_accel.__version__ # the wheel's, not the tree's
    for tool in ('fastxtend-verify-checkpoint', 'fastxtend-requeue'):
        res = subprocess.run([venv/'bin'/tool, '--help'], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert res.returncode == 0 and 'usage' in res.stdout.lower(), (tool, res.stdout[-2000:], res.stderr[-2000:])

def test_demo_command_on_a_fresh_clone(tmp_path):
    "The README's demo, `bash tools/demo.sh`, on a fresh clone (of the committed HEAD): set up, 2 processes train"
    clone = tmp_path/'clone'
    subprocess.run(['git', 'clone', '-q', ROOT, clone], check=True)
    # the clone's venv sees the tree's packages through a `.pth` (no second download of torch and fastai); `setup.sh`
    # still runs as it does for a newcomer, and installs the clone itself, editable, into it
    subprocess.run([Path(sys.base_prefix)/'bin'/'python3', '-m', 'venv', clone/'.venv'], check=True)
    site = next((clone/'.venv'/'lib').glob('python3*/site-packages'))
    (site/'deps.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    env = {k: v for k,v in os.environ.items() if k != 'PYTHONPATH'}
    res = subprocess.run(['bash', 'tools/demo.sh', '--epochs', '2'], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    out = res.stdout + res.stderr
    assert re.search(r'Training on 2 process\(es\), cpu(:0)?, mixed precision bf16', out), out[-3000:]
    # fastai's table, printed by the main process among the progress bars: a row an epoch
    rows = [l.split() for l in re.split(r'[\r\n]', out) if re.match(r'\W*\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d\d:\d\d', l)]
    assert [r[0].lstrip('\u2588') for r in rows] == ['0', '1'], out[-3000:]
    # two epochs of digits: ~97% here (5, the demo's default, ~98%); 0.9 leaves room for other CPUs' float sums
    assert float(out.split('final validation accuracy:')[1].split()[0]) > 0.9, out[-3000:]
    res = subprocess.run([clone/'.venv'/'bin'/'python', '-c', 'import fastxtend_accel; print(fastxtend_accel.__file__)'],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(res.stdout.strip()).is_relative_to(clone) # the clone's code trained, not the tree's

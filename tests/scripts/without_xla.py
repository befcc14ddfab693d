"""Run the script `argv[1]` (its arguments after it) in a process where `import torch_xla` fails: Accelerate sets up the
CPU, and a file that needs torch_xla to load fails."""
import runpy, sys
sys.modules['torch_xla'] = None # `importlib.util.find_spec('torch_xla')` is None, `import torch_xla` raises ImportError
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')

"`python -m fastxtend_accel.checkpoint PATH`: verify a checkpoint, as the `fastxtend-verify-checkpoint` command does"
from .checksums import verify_checkpoint_cmd

verify_checkpoint_cmd()

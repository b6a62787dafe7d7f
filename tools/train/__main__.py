"""`torchrun --nproc-per-node N -m shardfeed.tools.train DATA`: the trainer as a module."""

import argparse
import sys

from shardfeed.tools.text import HelpFormatter
from shardfeed.tools.train.train_cmd import add_arguments, main

parser = argparse.ArgumentParser(prog="shardfeed train", formatter_class=HelpFormatter)
add_arguments(parser)
sys.exit(main(parser.parse_args()))

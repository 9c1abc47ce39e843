"""``python -m autograder <command>``: the instructor commands in course.py."""

import sys

from .cli import main

sys.exit(main())

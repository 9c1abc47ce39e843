"""``python -m autograder <command>``: the instructor commands in course.py."""

import sys

from .course import main

sys.exit(main())

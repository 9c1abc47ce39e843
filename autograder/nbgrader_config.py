"""nbgrader configuration of the lab's course: this folder is the course root, one assignment.

nbgrader reads it when it runs with this folder as the working directory, or from anywhere with
``--NbGrader.config_file=autograder/nbgrader_config`` (no ".py": nbgrader 0.9 apps have no
``--config`` alias and append ".py" themselves); ``python -m autograder`` (course.py) loads it too.
The course root comes from this file's location, so every cwd gives the same course.
"""

from pathlib import Path

from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

c = get_config()  # noqa: F821 (traitlets defines get_config and __file__ when it loads this file)

COURSE_ROOT = Path(__file__).resolve().parent  # autograder/: source/, release/, gradebook.db, ...
ASSIGNMENT = "lab"  # the one assignment: the seven graded notebooks, graded together, in order

c.CourseDirectory.root = str(COURSE_ROOT)
c.CourseDirectory.source_directory = "source"  # masters in source/lab/*.ipynb
c.CourseDirectory.assignment_id = ASSIGNMENT  # so `nbgrader generate_assignment --force` needs no id

# Per-cell time limit in seconds when nbgrader runs a notebook (validate, autograde). This is the
# option nbgrader's own Execute preprocessor honours; ExecutePreprocessor.timeout (nbconvert's) is
# not read by it. A cell that runs longer is interrupted and costs that cell, never the batch.
c.Execute.timeout = 600

# ClearSolutions.code_stub keeps nbgrader's default: each ### BEGIN/END SOLUTION region becomes
#     # YOUR CODE HERE
#     raise NotImplementedError()


class GradeWithTheGrader(NbGraderPreprocessor):
    """Stands where nbgrader's Execute would run a submission in ``nbgrader autograde`` (and
    formgrader's autograde button), and refuses: there the student's own kernel would decide every
    test cell, outside any sandbox. ``python -m autograder grade`` puts its sandboxed Execute here
    and decides each cell with the grader's verdicts."""

    replaced_by_the_grader = True  # submission.py swaps it for its own Execute

    def preprocess(self, nb, resources):
        raise RuntimeError(
            "This course is not graded with `nbgrader autograde`: it would run each submission with no "
            "sandbox, its own kernel deciding every test cell. Run `python -m autograder grade` from the "
            "lab's checkout instead (nbgrader's autograde inside each submission's sandbox, every test "
            "cell decided by the grader's verdicts).")


c.Autograde.autograde_preprocessors = [
    GradeWithTheGrader if pp is Execute else pp
    for pp in Autograde.class_traits()["autograde_preprocessors"].default()]

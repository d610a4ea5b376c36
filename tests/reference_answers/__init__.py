"""Reference answers to the exercises, one module per exercise: for the tests of the checkers.

They live here, in the repository's tests, not in the installed package; every checker refuses an answer
imported from here (``minidl_course.exercises.ReferenceAnswer``), so the tests hand the checkers a learner's
copy (``tests/exercise_support.py``). The solution notebooks show the same code in their cells.
"""

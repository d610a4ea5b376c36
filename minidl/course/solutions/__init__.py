"""Reference answers to the exercises: the tests import them; exercise notebooks and checkers never do."""

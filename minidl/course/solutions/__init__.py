"""Reference answers to the exercises, one module per exercise: for the tests of the checkers.

The solution notebooks show the same code in their cells. No exercise notebook and no checker imports this
package: a checker computes what it expects from torch, the spec or its own measurement.
"""

"""Starter scripts of the exercises that make the learner write code, with a solution each (07: ft_starter)."""

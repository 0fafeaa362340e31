"""Starter scripts of the exercises that make the learner write code, with a solution each (07: ft_starter), and the
measurement one check launches (06-2: bucket_counter)."""

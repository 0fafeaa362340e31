"""The solutions of the exercises that make the learner write code (06-1: ddp_solution, 07-3: ft_solution, 08-3:
hang_solution, 12-1: local_rank_solution), each the one real file its starter is read out of
(mnist_helpers.course.starters), and the measurement one check launches (06-2: bucket_counter)."""

"""workers/bench"""

"""workers/demos"""

"""workers/bugs"""

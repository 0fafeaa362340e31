"""workers/progression"""

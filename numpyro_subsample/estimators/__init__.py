"""estimators"""

"""sgmcmc"""

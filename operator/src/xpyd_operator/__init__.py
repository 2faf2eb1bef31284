"""Kopf operator that reconciles PDDeployments into instance pods, services and a router."""

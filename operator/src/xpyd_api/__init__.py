"""The PDDeployment contract: typed models, labels and conditions shared by operator and controller."""

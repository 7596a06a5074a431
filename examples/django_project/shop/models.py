from django.db import models


class Order(models.Model):
    account = models.CharField(max_length=64)
    email = models.EmailField()
    total = models.IntegerField()
    receipt_sent = models.BooleanField(default=False)

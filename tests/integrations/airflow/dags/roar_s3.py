"""A @task.roar task that gets an object from S3 and puts a cleaned copy (boto3; the server
is $AWS_ENDPOINT_URL_S3, moto's in the tests)."""

import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False, tags=["roar-test"])
def roar_s3():
    @task.roar
    def clean() -> None:
        import boto3

        s3 = boto3.client("s3")
        data = s3.get_object(Bucket="raw", Key="in.csv")["Body"].read()
        s3.put_object(Bucket="clean", Key="out.csv", Body=data.upper())

    clean()


roar_s3()
